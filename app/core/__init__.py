"""What every part of the service stands on: settings, the database and its models, migrations,
errors and their statuses, auth, the client's address behind proxies, the request limits, process
locks and lifetimes, and metrics."""

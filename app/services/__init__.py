"""Use cases: each owns its transaction and keeps SQL and the index in step."""

"""The HTTP service: the app factory, its dependencies and body limit, the routes, MCP's transport,
and the connections and worker processes `moerag serve` runs it in."""

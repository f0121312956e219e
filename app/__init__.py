"""moerag's service: settings, SQL catalogue, use cases, REST routes and CLI."""

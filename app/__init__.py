"""moerag's service: settings, SQL catalogue, use cases, REST routes and CLI."""

from app.core.lifeline import bind_to_parent

bind_to_parent()  # first: a helper the server started dies with it, even while still importing

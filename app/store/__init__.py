"""The catalogue in SQL and the index's change log: what every process follows to stay current."""

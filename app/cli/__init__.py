"""The `moerag` command: one module a group of commands (`main` parses and dispatches)."""

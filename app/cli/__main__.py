"""`python -m app.cli`: the `moerag` command."""

from app.cli.main import main

main()

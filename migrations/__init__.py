"""Alembic migrations (a package so they ship with the install)."""

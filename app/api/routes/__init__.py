"""Thin HTTP routes; the work lives in app.services."""

"""Alembic revisions of Relay's schema (loaded by Alembic from this directory, not imported)."""

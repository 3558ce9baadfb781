"""Deterministic Temporal workflows. Nothing here does I/O or imports FastAPI, SQLAlchemy or websockets."""

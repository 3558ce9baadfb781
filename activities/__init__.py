"""Temporal activities: registry and audit writes, candidate selection, messages to executors."""

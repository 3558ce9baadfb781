"""Relay's gateway: executor WebSocket, connection hub, REST admin API, settings and storage."""

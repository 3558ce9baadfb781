"""Relay's shared kernel: settings, units, errors, logs, the Temporal client, models, store, wire format."""

"""The `relay` command: admin commands and tables, `relay dev`, `relay gateway`, `relay worker`."""

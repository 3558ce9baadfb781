"""Relay's benchmark suite (`make bench`): P1 memory, P2 CPU, P3 connect storm, P4 liveness precision and
P6 reconnect storm, each measured side by side with its baseline in the same run.

Run as a module (`python -m tests.bench`), never by pytest: no file here is named ``test_*.py``.
"""

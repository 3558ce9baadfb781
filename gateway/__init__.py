"""The executor socket process: socket protocol, liveness, per-connection protocol state, hub, admission,
revocation, contact with Temporal, its runtime, and the socket-bound activities that run in it."""

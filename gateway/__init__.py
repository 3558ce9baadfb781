"""The executor socket process: socket protocol, liveness, per-connection protocol state, hub, admission,
revocation, contact with Temporal, its runtime, and the socket-bound activities that run in it.

The REST API (``api/``) sees the gateway through these names only: the ``Gateway`` (its methods are what the API
asks of it), the management answers it reads, and the request-body limit it installs."""

from gateway.http_limits import BodyLimit
from gateway.management import Answer, Pick
from gateway.runtime import Gateway

__all__ = ["Answer", "BodyLimit", "Gateway", "Pick"]

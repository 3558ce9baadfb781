"""Logging set-up. Keys travel in the WebSocket path, so every record is scrubbed of them before output."""

from __future__ import annotations

import logging
import re

# The last path segment of /websocket/{app}/{key}, and any dbos_ key anywhere else in a message.
_WS_PATH = re.compile(r"(/websocket/[^/\s\"']+/)[^\s\"'?]+")
_KEY = re.compile(r"dbos_[A-Za-z0-9_\-]{8,}")


def scrub(text: str) -> str:
    return _KEY.sub("dbos_<redacted>", _WS_PATH.sub(r"\1<redacted>", text))


class RedactKeys(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = scrub(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def install_redaction() -> None:
    """Attach the filter to the handlers of the loggers that may see a request path."""
    redact = RedactKeys()
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access", "relay", "websockets"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactKeys) for f in logger.filters):
            logger.addFilter(redact)
        for handler in logger.handlers:
            if not any(isinstance(f, RedactKeys) for f in handler.filters):
                handler.addFilter(redact)

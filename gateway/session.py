"""The per-connection protocol state machine, with no sockets in it.

States: AWAITING_INFO (``executor_info`` sent, reply due) → OPEN (requests and replies) → CLOSED. Feed it
frames with ``receive``; it returns what happened, and the socket code around it acts on that.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from core import wire
from core.errors import NestingError, ProtocolError
from gateway import identity as identities


class State(Enum):
    AWAITING_INFO = "awaiting_info"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True)
class Handshake:
    """The executor identified itself."""

    info: wire.ExecutorInfoReply


@dataclass(frozen=True)
class Reply:
    """A reply to a request this session sent."""

    reply: (wire.RecoveryReply | wire.ExistPendingWorkflowsReply | wire.RetentionReply | wire.OtherReply
            | wire.ExecutorInfoReply)


@dataclass(frozen=True)
class Ignored:
    """A frame that answers nothing we asked (late or unsolicited); logged, not fatal."""

    reason: str


Event = Handshake | Reply | Ignored


class Session:
    def __init__(self, *, identity: Callable[[wire.ExecutorInfoReply], None] | None = None) -> None:
        """``identity`` checks the executor's ``executor_info`` reply; what it raises (an ``IdentityError``) fails
        the handshake like any other protocol error."""
        self.identity = identity
        self.state = State.AWAITING_INFO
        self.info_request_id = str(uuid.uuid4())
        self.pending: set[str] = set()

    def start(self) -> str:
        """The first frame: the server speaks first."""
        return wire.executor_info_request(self.info_request_id)

    def expect(self, request_id: str) -> None:
        """Note a request sent on this connection, so its reply is recognised."""
        self.pending.add(request_id)

    def forget(self, request_id: str) -> None:
        self.pending.discard(request_id)

    def receive(self, frame: str | bytes) -> Event:
        """Raises ``ProtocolError`` when the frame breaks the protocol; the caller then closes the socket."""
        if self.state is State.CLOSED:
            return Ignored("connection closed")
        try:
            message = wire.parse_reply(frame)
        except NestingError:
            if self.state is State.AWAITING_INFO:  # the SDK sends the same frame on every reconnect: refuse for good
                raise identities.nested_too_deep() from None
            raise
        if self.state is State.AWAITING_INFO:
            if not isinstance(message, wire.ExecutorInfoReply):
                raise ProtocolError(f"expected an executor_info reply, got {message.type!r:.{wire.TYPE_MAX}}")
            if message.request_id != self.info_request_id:
                raise ProtocolError("executor_info reply with an unknown request_id")
            if self.identity is not None:
                self.identity(message)
            self.state = State.OPEN
            return Handshake(message)
        if message.request_id not in self.pending:
            return Ignored(f"{message.type:.{wire.TYPE_MAX}} reply for unknown request "
                           f"{message.request_id!r:.{wire.TYPE_MAX}}")
        self.pending.discard(message.request_id)
        return Reply(message)

    def close(self) -> None:
        self.state = State.CLOSED
        self.pending.clear()

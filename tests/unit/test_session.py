"""The session state machine and wire decoding, fed frames directly (no sockets)."""

from __future__ import annotations

import json

import pytest

from core import wire
from core.errors import ProtocolError
from gateway import session as sm


def _info(request_id: str, **fields: object) -> str:
    return json.dumps({"type": "executor_info", "request_id": request_id, "executor_id": "ex-1", **fields})


def test_handshake_then_replies() -> None:
    s = sm.Session()
    assert json.loads(s.start()) == {"type": "executor_info", "request_id": s.info_request_id}
    event = s.receive(_info(s.info_request_id, application_version="v1", unknown_future_field=1))
    assert isinstance(event, sm.Handshake) and event.info.application_version == "v1"
    assert s.state is sm.State.OPEN
    s.expect("r1")
    reply = s.receive(json.dumps({"type": "recovery", "request_id": "r1", "success": True}))
    assert isinstance(reply, sm.Reply) and isinstance(reply.reply, wire.RecoveryReply) and reply.reply.success
    late = s.receive(json.dumps({"type": "recovery", "request_id": "r1", "success": True}))
    assert isinstance(late, sm.Ignored)  # answered once; a second answer completes nothing


@pytest.mark.parametrize("frame", [
    "not json", "[]", json.dumps({"type": "recovery", "request_id": "x", "success": True}),
    json.dumps({"type": "executor_info", "request_id": "wrong", "executor_id": "e"}),
    json.dumps({"type": "executor_info", "request_id": "{rid}"}),
    json.dumps({"type": "executor_info", "request_id": "{rid}", "executor_id": ""}),
])
def test_bad_handshakes_are_protocol_errors(frame: str) -> None:
    s = sm.Session()
    with pytest.raises(ProtocolError):
        s.receive(frame.replace("{rid}", s.info_request_id))
    assert s.state is sm.State.AWAITING_INFO


def test_missing_required_reply_field_is_a_protocol_error() -> None:
    s = sm.Session()
    s.receive(_info(s.info_request_id))
    s.expect("r2")
    with pytest.raises(ProtocolError, match="exist"):
        s.receive(json.dumps({"type": "exist_pending_workflows", "request_id": "r2"}))


def test_unknown_type_reply_still_completes_its_request() -> None:
    s = sm.Session()
    s.receive(_info(s.info_request_id))
    s.expect("r3")
    event = s.receive(json.dumps({"type": "fancy", "request_id": "r3", "error_message": "Unknown message type"}))
    assert isinstance(event, sm.Reply) and event.reply.error_message == "Unknown message type"


def test_closed_session_ignores_frames() -> None:
    s = sm.Session()
    s.close()
    assert isinstance(s.receive("garbage"), sm.Ignored)

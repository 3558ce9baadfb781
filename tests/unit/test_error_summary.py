"""``wire.error_summary``: what a REST problem quotes of an executor's ``error_message`` — its messages, never its
stack trace (resume and fork of an unknown id once answered 502 with a whole Python traceback in ``detail``).
The route around it: tests/api/test_management.py."""

from __future__ import annotations

import traceback

from hypothesis import given
from hypothesis import strategies as st

from core import wire


def _python_error() -> str:
    """As dbos 3.2.0's ``_report_exception`` builds it: a context, then ``traceback.format_exc()`` of a chained
    exception."""
    def lookup(key: str) -> None:
        raise KeyError(key)

    try:
        try:
            lookup("workflow")
        except KeyError as err:
            raise RuntimeError("Non-existent target workflow ID: nosuch") from err
    except RuntimeError:
        error = f"Exception encountered when resuming workflow(s) ['nosuch']: {traceback.format_exc()}"
    return error


def test_a_python_traceback_becomes_its_messages() -> None:
    error = _python_error()
    assert "Traceback (most recent call last)" in error and 'File "' in error
    assert wire.error_summary(error) == ("Exception encountered when resuming workflow(s) ['nosuch']; "
                                         "KeyError: 'workflow'; RuntimeError: Non-existent target workflow ID: nosuch")


def test_a_javascript_or_java_stack_keeps_only_its_message() -> None:
    assert wire.error_summary("Error: no such workflow\n    at cancel (conductor.js:10:5)\n    at run") \
        == "Error: no such workflow"
    assert wire.error_summary("java.lang.IllegalStateException: gone\n\tat dev.dbos.X.y(X.java:1)\n"
                              "Caused by: java.io.IOException: eof\n\tat z") \
        == "java.lang.IllegalStateException: gone; Caused by: java.io.IOException: eof"


@given(st.text(), st.integers(min_value=20, max_value=400))
def test_a_summary_is_bounded_and_never_a_traceback(error: str, limit: int) -> None:
    said = wire.error_summary(error + "\n" + _python_error(), limit)
    assert len(said) <= limit and said
    assert "Traceback (most recent call last)" not in said and '  File "' not in said

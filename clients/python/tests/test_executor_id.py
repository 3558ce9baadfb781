"""``relay_dbos.executor_id()``: one id per process (a forked child draws its own), a fixed one as given."""

from __future__ import annotations

import os
import uuid
import warnings

import pytest

import relay_dbos


def test_the_same_id_twice_in_a_process() -> None:
    first = relay_dbos.executor_id()
    assert relay_dbos.executor_id() == first
    assert str(uuid.UUID(first)) == first


def test_a_fixed_id_is_returned_as_given() -> None:
    assert relay_dbos.executor_id("orders-0") == "orders-0"
    assert relay_dbos.executor_id(" pod name ") == " pod name "
    assert relay_dbos.executor_id() != "orders-0"  # the process's own id is not replaced by a fixed one


@pytest.mark.parametrize("fixed", ["", " ", "\t\n"])
def test_an_empty_fixed_id_is_refused(fixed: str) -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        relay_dbos.executor_id(fixed)


def test_a_forked_child_draws_a_new_id() -> None:
    parent = relay_dbos.executor_id()
    read, write = os.pipe()
    with warnings.catch_warnings():  # Python >= 3.12 warns about fork() in a process with threads (DBOS's)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: nothing but the id, then out without pytest's teardown
        try:
            os.close(read)
            ids = f"{relay_dbos.executor_id()} {relay_dbos.executor_id()}"
            os.write(write, ids.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_first, child_second = pipe.read().split()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_first == child_second  # the child's id is stable in the child too
    assert child_first != parent
    assert str(uuid.UUID(child_first)) == child_first
    assert relay_dbos.executor_id() == parent  # and the parent's has not changed

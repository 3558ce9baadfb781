"""REST routes for queues (upstream listQueues, getQueue), read from any HEALTHY executor of the app."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from api import conductor as c
from api.managed import PREFIX, READ_ERRORS, ManagedDep
from core.errors import NotFoundError

router = APIRouter(prefix=PREFIX, tags=["Queues"])

QueueName = Annotated[str, Path(min_length=1)]


@router.get("/queues", operation_id="listQueues", summary="List queues", responses=READ_ERRORS)
async def list_queues(m: ManagedDep) -> list[c.Queue]:
    """The queues the executor knows: those declared in its code and those recorded in the system database."""
    reply = await m.read("list_queues", {"body": {}}, c.ListQueuesReply)
    return [c.queue_of(q) for q in reply.output]


@router.get("/queues/{queueName}", operation_id="getQueue", summary="Get queue", responses=READ_ERRORS)
async def get_queue(m: ManagedDep, queueName: QueueName) -> c.Queue:
    reply = await m.read("get_queue", {"name": queueName}, c.GetQueueReply)
    if reply.output is None:
        raise NotFoundError(f"queue {queueName!r} not found")
    return c.queue_of(reply.output)

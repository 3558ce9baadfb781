"""What every workflow contract shares: task queue and activity names, search attributes, workflow ids, the
executor's status and self-description, the signals the gateway watch sends too, and a chosen peer."""

# No ``from __future__ import annotations``: a contract's annotations are types, not names (the package's docstring).
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from core.types import (
    RELAY_APP_ATTRIBUTE,
    RELAY_APP_VERSION_ATTRIBUTE,
    RELAY_EXECUTOR_ID_ATTRIBUTE,
    RELAY_EXECUTOR_STATUS_ATTRIBUTE,
    RELAY_ORG_ATTRIBUTE,
)
from core.types import SEARCH_ATTRIBUTES as SEARCH_ATTRIBUTES
from core.types import ExecutorInfo as ExecutorInfo
from core.types import ExecutorStatus as ExecutorStatus

SHARED_TASK_QUEUE = "relay"
GATEWAY_TASK_QUEUE_PREFIX = "relay-gateway-"


class Activity:
    """Activity names, each defined once: the stubs in the contracts and the implementations both use them.

    Database activities run on the shared queue; socket-bound ones on a gateway's own queue.
    """

    RECORD_STATUS = "record_status"
    GET_EXECUTOR_TIMEOUT = "get_executor_timeout"
    # DISCONNECTED and the grace it begins, in one local activity.
    BEGIN_GRACE = "begin_grace"
    SELECT_CANDIDATE = "select_candidate"
    # DEAD and a recovery's first steps (the gate, a peer, the gateway known gone or not), in one local activity
    # (``DEAD_IN_ONE_STEP_PATCH``).
    DECLARE_DEAD = "declare_dead"
    WRITE_AUDIT = "write_audit"
    DELETE_EXECUTOR = "delete_executor"
    DISPATCH_RECOVERY = "dispatch_recovery"
    EXIST_PENDING_WORKFLOWS = "exist_pending_workflows"
    # Retention: database activities on the shared queue, dispatch on the executor's gateway queue.
    LIST_RETENTION_TARGETS = "list_retention_targets"
    SELECT_RETENTION_EXECUTOR = "select_retention_executor"
    WRITE_RETENTION_AUDIT = "write_retention_audit"
    DISPATCH_RETENTION = "dispatch_retention"
    # The audit log's own retention: a database activity of the round, on the shared queue.
    PRUNE_AUDIT_LOG = "prune_audit_log"
    # Gateway watch: held on the gateway's own queue; the sweep runs on the shared queue once it is gone.
    HOLD_GATEWAY = "hold_gateway"
    DISCONNECT_GATEWAY_EXECUTORS = "disconnect_gateway_executors"
    # The fence: asked on a gateway's own queue before anything is declared gone. A gateway that does not pick it
    # up within its schedule-to-start timeout counts as gone; one that does says whether it holds the socket.
    PROBE_GATEWAY = "probe_gateway"
    # Whether a gateway is known gone (a database read on the shared queue): one that is is never probed.
    GATEWAY_GONE = "gateway_gone"
    # The recovery gate (an operator's pause, the recovery-storm breaker's pacing): a local activity of the lifecycle
    # workflow, asked before a recovery's first request.
    ADMIT_RECOVERY = "admit_recovery"
    # Alerts: the scheduled round's database activities and the webhook, on the shared queue (the ``alert`` message
    # to an executor goes through its gateway's ``executor_request``).
    LOAD_ALERT_ROUND = "load_alert_round"
    EVALUATE_ALERT_RULE = "evaluate_alert_rule"
    WRITE_ALERT_AUDIT = "write_alert_audit"
    ADVANCE_ALERT_WATERMARK = "advance_alert_watermark"
    SEND_ALERT_WEBHOOK = "send_alert_webhook"
    # Relay's own alerts as they happen: starting one's delivery (a local activity of the lifecycle workflow, an
    # activity of the round for a row nobody started), and its rate (a database activity of the delivery).
    START_OWN_ALERT = "start_own_alert"
    CLAIM_OWN_ALERT = "claim_own_alert"
    # The orphan sweep: database activities and starting lifecycle workflows, on the shared queue (the aggregates
    # request to an executor goes through its gateway's ``executor_request``).
    LIST_ORPHAN_TARGETS = "list_orphan_targets"
    FIND_ORPHANS = "find_orphans"
    START_ORPHAN_RECOVERY = "start_orphan_recovery"
    # The reconciliation: the round's scan of the registry (starting lifecycle workflows), on the shared queue, and
    # the registry row a lifecycle workflow it started reads back (a local activity).
    RECONCILE_REGISTRY = "reconcile_registry"
    GET_REGISTRY_ROW = "get_registry_row"
    # Workflow management: an operator's request to an executor held by another gateway process, run as a local
    # activity of a ``ManagementRequestWorkflow`` on that process's own queue.
    EXECUTOR_REQUEST = "executor_request"


# What an activity stub raises if it is ever run: only its name and signature are used (by the workflows).
STUB = "an activity contract: the worker or the gateway registers the implementation under the same name"


def gateway_workflow_id(gateway_queue: str) -> str:
    return f"relay-gateway/{gateway_queue}"


def lifecycle_workflow_id(org: str, app: str, executor_id: str) -> str:
    return f"relay-executor/{org}/{app}/{executor_id}"


# Relay's search attributes (``SEARCH_ATTRIBUTES``, named in core.types) as typed keys: one definition for every
# writer and reader.
RELAY_ORG = SearchAttributeKey.for_keyword(RELAY_ORG_ATTRIBUTE)
RELAY_APP = SearchAttributeKey.for_keyword(RELAY_APP_ATTRIBUTE)
RELAY_EXECUTOR_ID = SearchAttributeKey.for_keyword(RELAY_EXECUTOR_ID_ATTRIBUTE)
RELAY_APP_VERSION = SearchAttributeKey.for_keyword(RELAY_APP_VERSION_ATTRIBUTE)
RELAY_EXECUTOR_STATUS = SearchAttributeKey.for_keyword(RELAY_EXECUTOR_STATUS_ATTRIBUTE)
# The lifecycle workflow's type name: the workflow is defined under it (workflows.lifecycle), and the activities
# that query or start lifecycles by type (orphans, reconciliation) use it, as they may not import workflow code.
LIFECYCLE_WORKFLOW_TYPE = "ExecutorLifecycleWorkflow"


def lifecycle_search_attributes(org: str, app: str, executor_id: str, version: str,
                                status: str | None = None) -> TypedSearchAttributes:
    """What a lifecycle workflow is started with (the gateway's signal-with-start, the orphan sweep's and the
    reconciliation's starts), so Temporal's visibility finds it by org, app, executor and version; and by
    ``status`` when the starter knows it (the gateway: HEALTHY, the socket is open), which the workflow's first
    record then need not upsert."""
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(RELAY_ORG, org), SearchAttributePair(RELAY_APP, app),
        SearchAttributePair(RELAY_EXECUTOR_ID, executor_id), SearchAttributePair(RELAY_APP_VERSION, version)]
    if status is not None:
        pairs.append(SearchAttributePair(RELAY_EXECUTOR_STATUS, status))
    return TypedSearchAttributes(pairs)


@dataclass
class ConnectedSignal:
    connection_id: str
    gateway_queue: str
    info: ExecutorInfo
    # Idempotency key: the gateway retries signals, and Temporal does not deduplicate them.
    signal_id: str
    source_ip: str = ""
    # When the gateway finished the handshake (its clock): the registry write reports how long after it landed
    # (``relay_signal_delay_seconds``). None in signals from before it was sent.
    at: datetime | None = None


@dataclass
class DisconnectedSignal:
    connection_id: str
    signal_id: str
    reason: str = "closed"
    # When the gateway saw the socket close (for the signal-delay metric); None when no gateway saw it (a gateway
    # found gone, whose executors are disconnected on its behalf).
    at: datetime | None = None


@dataclass
class Candidate:
    """A HEALTHY executor chosen to carry a request (a recovery, a retention round), and where its socket is."""

    executor_id: str
    gateway_queue: str
    app_version: str = ""
    # True when the app allows cross-version recovery and no peer of the dead executor's version was HEALTHY.
    cross_version: bool = False

"""Every audit operation Relay writes, with what it means: the one list the reference's audit page is generated from
(docs/reference.py), and that tests/unit/test_audit_events.py holds against the operations the code writes."""

from __future__ import annotations

# operation -> meaning. Each row also carries its org, app, executor id (where it is about one), status (success or
# failure), subject (who: an API key's name, or "system") and details (JSON, per operation).
AUDIT_EVENTS: dict[str, str] = {
    # An executor's lifecycle, as its lifecycle workflow and its gateway record it.
    "executor.healthy": "An executor connected and answered `executor_info`: registered HEALTHY.",
    "executor.reconnected": "A DISCONNECTED executor connected again within its grace: HEALTHY again.",
    "executor.superseded": "A HEALTHY executor connected again: the new socket superseded its previous one "
                           "(close code 4000 to the old one).",
    "executor.disconnected": "An executor's socket closed, or its gateway was found gone: DISCONNECTED, its grace "
                             "starts.",
    "executor.grace.extended": "The grace ended less than a grace after the executor's gateway regained contact "
                               "with Temporal: the grace runs a whole grace from that moment instead.",
    "executor.fenced": "The gateway that last held an executor still had a live socket for it when it was about to "
                       "be declared DEAD: it is not dead.",
    "executor.dead": "An executor's grace ended and no gateway holds it: DEAD, its recovery begins.",
    "executor.refused": "An executor's upgrade refused before the WebSocket opened (details: the HTTP status and "
                        "the reason; reported at most once a minute per source).",
    "executor.protocol_error": "An executor's handshake or a message of its failed to parse, or it sent a "
                               "malformed reply (details: the reason; reported at most once a minute per source).",
    "executor.deleted": "A DEAD executor's record deleted, after its recovery was confirmed (or with its app).",
    "executor.reconciled": "A registry row whose lifecycle workflow was not running got its workflow started again "
                           "by the reconciliation.",
    "executor.orphan.found": "The orphan sweep found PENDING workflows of an executor id Relay had no record of, and "
                             "started a lifecycle for it (as DEAD, to recover them).",
    "executor.drain.set": "An operator drained an executor: it gets no new recoveries or requests.",
    "executor.drain.cleared": "An operator undrained an executor.",
    # Recovery.
    "executor.recovery.dispatched": "A `recovery` request sent to a HEALTHY peer for a DEAD executor (details: the "
                                    "peer, the attempt).",
    "executor.recovery.succeeded": "The peer re-enqueued the DEAD executor's workflows and none remains PENDING: "
                                   "recovery confirmed.",
    "executor.recovery.failed": "A recovery attempt failed (details: why; the next attempt goes to another peer).",
    "executor.recovery.cancelled": "A recovery request was not sent: the executor was found alive right before it.",
    "executor.recovery.blocked": "No HEALTHY peer of the dead executor's version: its recovery waits (Relay's own "
                                 "alert RecoveryBlocked).",
    "executor.recovery.unblocked": "A blocked recovery found a peer again (RecoveryUnblocked).",
    "executor.recovery.held": "A recovery held by the app's pause or its tripped storm breaker (once per recovery).",
    "app.recovery.breaker_tripped": "The recovery-storm breaker tripped for an app: recoveries are paced (Relay's own "
                                    "alert RecoveryBreaker).",
    "app.recovery.breaker_reset": "An operator reset an app's tripped recovery-storm breaker.",
    "app.recovery.paused": "An operator paused an app's recoveries.",
    "app.recovery.resumed": "An operator resumed an app's recoveries.",
    # Applications and their settings.
    "app.registered": "An application registered (by the REST API, the CLI or its first executor).",
    "app.updated": "An application's settings changed (details: old and new values).",
    "app.deleted": "An application deleted, with its executors' records and settings.",
    "app.autoscaling_policy.set": "An application's autoscaling policy set.",
    "app.autoscaling_policy.deleted": "An application's autoscaling policy deleted.",
    "version.set_latest": "An application version made the latest.",
    # Gateways.
    "gateway.rebalanced": "A gateway closed executor sockets to even out the gateways' shares (one row per org per "
                          "episode: what moved, the counts before and after).",
    # Retention and the orphan sweep.
    "retention.dispatched": "A retention request sent to an executor of the app.",
    "retention.succeeded": "A retention round of the app done.",
    "retention.failed": "A retention round failed (details: the reason).",
    "retention.skipped": "A retention round skipped (details: why, e.g. no HEALTHY executor).",
    "orphans.found": "The orphan sweep found executor ids with old PENDING workflows and no record (Relay's own "
                     "alert OrphansFound).",
    # Alerts.
    "alert_rule.created": "An alert rule created.",
    "alert_rule.deleted": "An alert rule deleted.",
    "alert.sent": "An alert delivered (to the webhook, or to an executor's `alert` handler).",
    "alert.failed": "An alert's delivery failed (details: the channel and the reason).",
    "alert.suppressed": "An alert held back by the minimum interval between alerts of one rule or kind.",
    # API keys.
    "token.created": "An API key created (its name and scope; never the key).",
    "token.deleted": "An API key revoked.",
    # Workflow management, as operators ask for it (details: the workflows and the outcome).
    "workflow.cancel": "A workflow cancelled.",
    "workflow.resume": "A workflow resumed.",
    "workflow.fork": "A workflow forked (details: the new workflow's id and the start step).",
    "workflow.delete": "A workflow deleted.",
    "workflow.import": "A workflow imported.",
    "workflow.bulk_cancel": "Workflows named by id cancelled in one operation.",
    "workflow.bulk_cancel_by_filter": "The workflows matching a filter cancelled in one operation.",
    "workflow.bulk_resume": "Workflows named by id resumed in one operation.",
    "workflow.bulk_resume_by_filter": "The workflows matching a filter resumed in one operation.",
    "workflow.bulk_delete": "Workflows named by id deleted in one operation.",
    "workflow.bulk_fork_by_filter": "The workflows matching a filter forked in one operation.",
    "workflow.bulk_fork_from_failure": "Failed workflows forked from their failed step in one operation.",
    "schedule.pause": "A schedule paused.",
    "schedule.resume": "A schedule resumed.",
    "schedule.trigger": "A schedule triggered once, now.",
    "schedule.backfill": "A schedule's runs over a past time window started.",
}

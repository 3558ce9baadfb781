"""REST routes for alerting rules (upstream listAlertingRules, createAlertingRule, deleteAlertingRule).

Rules are stored by Relay and evaluated by its alerts schedule (``workflows.alerts``; ``core.alerts`` says what
``ruleMetadata`` holds and when each rule type fires). Creating and deleting a rule is audited
(``alert_rule.created`` / ``alert_rule.deleted``) with the caller's key as subject. ``minIntervalSecs`` is
seconds here only: inside Relay it is a ``timedelta``. ``ruleMetadata`` is bounded in depth and size (422); a rule
stored before it was (or edited by hand) that cannot be shown is left out of the list, logged once, and can still
be deleted by its id.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import AppName, AppPrincipal, OrgName, StoreDep, source_ip
from api.managed import storable
from api.problems import responses
from api.schemas import AlertingRule, CreateAlertInputBody, extended
from core import alerts, models, units
from core.logs import OncePerKey
from core.store import subject_of

router = APIRouter(prefix="/v2/orgs/{orgName}/apps/{appName}/alerting-rules", tags=["Alerting"])

RuleId = Annotated[str, Path(min_length=1, max_length=100, json_schema_extra=extended("1-100 characters"))]
ERRORS = responses(401, 403, 404, 422)
# A stored rule that cannot be shown is found again on every list: said once per process.
_unshown = OncePerKey(logging.getLogger("relay.gateway"))


@router.get("", operation_id="listAlertingRules", summary="List alerting rules", responses=ERRORS)
async def list_alerting_rules(orgName: OrgName, appName: AppName, _p: AppPrincipal,
                              store: StoreDep) -> list[AlertingRule]:
    """The app's rules, oldest first."""
    rules = await run_in_threadpool(store.list_alert_rules, orgName, appName)
    return [AlertingRule.of(rule) for rule in rules if _shown(rule)]


def _shown(rule: models.AlertingRule) -> bool:
    problem = alerts.stored_rule_problem(rule.rule_type, rule.rule_metadata)
    if problem is not None:
        _unshown.warning(rule.id, "alerting rule %s of %s/%s left out of listAlertingRules: %s; delete it with "
                         "DELETE /v2/orgs/%s/apps/%s/alerting-rules/%s", rule.id, rule.org, rule.app, problem,
                         rule.org, rule.app, rule.id)
    return problem is None


@router.post("", operation_id="createAlertingRule", summary="Create alerting rule", status_code=201,
             responses=ERRORS)
async def create_alerting_rule(orgName: OrgName, appName: AppName, p: AppPrincipal, store: StoreDep,
                               request: Request, body: CreateAlertInputBody) -> AlertingRule:
    """404 when the app or the receiving app is not registered; 403 when the key is not allowed for either."""
    receiving = body.receivingAppName or appName
    p.require(receiving)
    min_interval = None if body.minIntervalSecs is None else units.seconds_to_timedelta(body.minIntervalSecs)
    rule = await run_in_threadpool(lambda: store.create_alert_rule(
        org=orgName, app=appName, receiving_app=receiving, rule_type=body.ruleType, metadata=storable(body.metadata()),
        min_interval=min_interval, subject=subject_of(p), source_ip=source_ip(request)))
    return AlertingRule.of(rule)


@router.delete("/{ruleId}", operation_id="deleteAlertingRule", summary="Delete alerting rule", status_code=204,
               responses=ERRORS)
async def delete_alerting_rule(orgName: OrgName, appName: AppName, ruleId: RuleId, p: AppPrincipal,
                               store: StoreDep, request: Request) -> Response:
    await run_in_threadpool(lambda: store.delete_alert_rule(orgName, appName, ruleId, subject=subject_of(p),
                                                            source_ip=source_ip(request)))
    return Response(status_code=204)

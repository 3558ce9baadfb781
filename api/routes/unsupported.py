"""Upstream operations on organizations, members, roles, permissions, secrets, users and domain claims: Relay has
none of these resources (its keys are per org, with no users), so each answers 404 problem+json, as upstream's
self-hosted mode does. They are in the spec so that a client generated from upstream's finds them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from starlette.routing import Route

from api.deps import OrgName
from api.problems import responses
from api.schemas import extended
from core.errors import NotFoundError

router = APIRouter(prefix="/v2", tags=["Unsupported"])

Username = Annotated[str, Path(min_length=3, max_length=30, pattern=r"^[a-z0-9_]+$")]
RoleName = Annotated[str, Path(min_length=3, max_length=30, pattern=r"^[a-zA-Z0-9_]+$")]
Domain = Annotated[str, Path(min_length=4, max_length=253)]

# operationId -> what Relay does not have
WHAT = {
    "getOrg": "organization settings", "updateOrg": "organization settings", "joinOrg": "organization members",
    "listMembers": "organization members", "removeMember": "organization members", "grantRole": "roles",
    "listPermissions": "permissions", "listRoles": "roles", "createRole": "roles", "deleteRole": "roles",
    "generateSecret": "secrets", "listDomainClaims": "domain claims", "requestDomainClaim": "domain claims",
    "releaseDomainClaim": "domain claims", "registerUser": "users", "getCurrentUser": "users",
}


def _absent(request: Request) -> NotFoundError:
    route = request.scope.get("route")
    operation = getattr(route, "operation_id", None) or (route.name if isinstance(route, Route) else "")
    what = WHAT.get(operation, "such resource")
    return NotFoundError(f"Relay (self-hosted) has no {what}: {operation} is not supported; Relay's keys are per "
                         "org (POST /v2/orgs/{orgName}/tokens/{tokenName}), with no users or roles")


async def _org(request: Request, orgName: OrgName) -> None:
    raise _absent(request)


async def _member(request: Request, orgName: OrgName, username: Username) -> None:
    raise _absent(request)


async def _member_role(request: Request, orgName: OrgName, username: Username, roleName: RoleName) -> None:
    raise _absent(request)


async def _role(request: Request, orgName: OrgName, roleName: RoleName) -> None:
    raise _absent(request)


async def _domain(request: Request, orgName: OrgName, domain: Domain) -> None:
    raise _absent(request)


async def _user(request: Request) -> None:
    raise _absent(request)


OPERATIONS: list[tuple[str, str, str, int, Any]] = [
    ("GET", "/orgs/{orgName}", "getOrg", 200, _org),
    ("PATCH", "/orgs/{orgName}", "updateOrg", 204, _org),
    ("GET", "/orgs/{orgName}/domain-claims", "listDomainClaims", 200, _org),
    ("POST", "/orgs/{orgName}/domain-claims", "requestDomainClaim", 201, _org),
    ("DELETE", "/orgs/{orgName}/domain-claims/{domain}", "releaseDomainClaim", 204, _domain),
    ("POST", "/orgs/{orgName}/join", "joinOrg", 204, _org),
    ("GET", "/orgs/{orgName}/members", "listMembers", 200, _org),
    ("DELETE", "/orgs/{orgName}/members/{username}", "removeMember", 200, _member),
    ("PUT", "/orgs/{orgName}/members/{username}/roles/{roleName}", "grantRole", 204, _member_role),
    ("GET", "/orgs/{orgName}/permissions", "listPermissions", 200, _org),
    ("GET", "/orgs/{orgName}/roles", "listRoles", 200, _org),
    ("POST", "/orgs/{orgName}/roles", "createRole", 201, _org),
    ("DELETE", "/orgs/{orgName}/roles/{roleName}", "deleteRole", 204, _role),
    ("POST", "/orgs/{orgName}/secrets", "generateSecret", 201, _org),
    ("POST", "/users", "registerUser", 201, _user),
    ("GET", "/users/me", "getCurrentUser", 200, _user),
]

for method, path, operation_id, _success, endpoint in OPERATIONS:
    router.add_api_route(path, endpoint, methods=[method], operation_id=operation_id, status_code=404,
                         summary=f"{operation_id} (not supported: 404)", responses=responses(404, 422),
                         response_model=None, include_in_schema=True,
                         openapi_extra=extended(f"not supported by Relay: always 404 (upstream answers "
                                                f"{_success} in hosted mode)"))

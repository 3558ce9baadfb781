"""REST routes for API tokens (upstream createToken, listTokens, deleteToken). Each needs an org-wide key.

A token is a Relay API key with a name (the path parameter): the secret is shown once, in ``TokenCreated``, and
stored as a SHA-256 hash only. Deleting a token revokes every live key of that name in the org and closes, at
once, the executor sockets that authenticated with them; other gateway processes close theirs within
``revocation.watch``'s interval.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import AdminPrincipal, GatewayDep, OrgName, StoreDep, TokenName, source_ip
from api.problems import responses
from api.schemas import CreateTokenInputBody, Token, TokenCreated
from core.store import subject_of

router = APIRouter(tags=["Tokens"])
CreateTokenBody = Annotated[CreateTokenInputBody, Body(default_factory=CreateTokenInputBody)]  # optional, not null


@router.post("/tokens/{tokenName}", operation_id="createToken", summary="Create token", status_code=201,
             responses=responses(401, 403, 404, 409, 422))
async def create_token(orgName: OrgName, tokenName: TokenName, p: AdminPrincipal, store: StoreDep,
                       request: Request, body: CreateTokenBody) -> TokenCreated:
    """``appNames`` restricts the token to those apps (registered or not); null or [] makes it org-wide. 409 if
    the org has a live token of that name."""
    key = await run_in_threadpool(lambda: store.create_token(
        org=orgName, name=tokenName, apps=body.appNames, subject=subject_of(p), source_ip=source_ip(request)))
    return TokenCreated(token=key, tokenName=tokenName)


@router.get("/tokens", operation_id="listTokens", summary="List tokens", responses=responses(401, 403, 404, 422))
async def list_tokens(orgName: OrgName, _p: AdminPrincipal, store: StoreDep) -> list[Token]:
    """The org's live tokens, oldest first, without their secrets. ``permissions`` is always []."""
    keys, app_ids = await run_in_threadpool(store.list_tokens, orgName)
    return [Token(tokenName=k.name, createdAt=k.created_at, permissions=[], appNames=k.apps,
                  appIds=[app_ids[a] for a in k.apps or [] if a in app_ids]) for k in keys]


@router.delete("/tokens/{tokenName}", operation_id="deleteToken", summary="Delete token", status_code=204,
               responses=responses(401, 403, 404, 422))
async def delete_token(orgName: OrgName, tokenName: TokenName, p: AdminPrincipal, store: StoreDep,
                       gateway: GatewayDep, request: Request) -> Response:
    """Revokes every live key of the org with that name and closes the executor sockets that use them (close
    code 1008): each counts as a disconnect."""
    key_ids = await run_in_threadpool(lambda: store.revoke_token(
        orgName, tokenName, subject=subject_of(p), source_ip=source_ip(request)))
    await gateway.close_key_sockets(set(key_ids))
    return Response(status_code=204)

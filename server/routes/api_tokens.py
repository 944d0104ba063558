"""API tokens: list, create, revoke (admin; docs/security.md, "Tokens")."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path
from pydantic import BaseModel, ConfigDict, Field

from server.api_tokens import create_token, list_tokens, revoke_tokens, token_json
from server.auth import ADMIN
from server.deps import StoreDep
from server.schemas import ApiRoute, Name, Text, errors

router = APIRouter(tags=["tokens"], route_class=ApiRoute, responses=errors(401))


class TokenIn(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    name: Annotated[Name, Field(min_length=1)]
    scopes: list[Literal["ingest", "read", "admin"]] = Field(min_length=1, description="admin implies the others")


@router.get("/tokens", dependencies=[ADMIN])
async def tokens(store: StoreDep) -> list[dict[str, Any]]:
    """Every token's id, name, scopes, creation time and whether it is revoked (never the token)."""
    return [token_json(row) for row in await list_tokens(store)]


@router.post("/tokens", status_code=201, dependencies=[ADMIN], responses=errors(429))
async def new_token(body: TokenIn, store: StoreDep) -> dict[str, Any]:
    """The only answer that carries the token: store it now."""
    token = await create_token(store, body.name, list(body.scopes))
    return {"name": body.name, "scopes": body.scopes, "token": token}


@router.delete("/tokens/{name}", dependencies=[ADMIN], responses=errors(404, 429))
async def revoke(name: Annotated[Text, Path(max_length=200)], store: StoreDep) -> dict[str, Any]:
    """Revoke every live token of this name: refused at once by every route, its open ingest
    and live sockets closed (4401) within `KEEL_TOKEN_RECHECK_S`."""
    count = await revoke_tokens(store, name)
    if not count:
        raise HTTPException(404, f"no live token named {name!r}")
    return {"name": name, "revoked": count}

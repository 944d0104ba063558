"""API tokens: list, create, revoke (admin; docs/security.md, "Tokens")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path
from pydantic import BaseModel, ConfigDict, Field

from server.api_tokens import create_token, list_tokens, revoke_tokens, token_json
from server.auth import ADMIN
from server.deps import StoreDep
from server.schemas import ApiRoute, Name, Scope, Text, errors

router = APIRouter(tags=["tokens"], route_class=ApiRoute, responses=errors(401))


class TokenIn(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    name: Annotated[Name, Field(min_length=1)]
    scopes: list[Scope] = Field(min_length=1, description="admin implies the others")


class TokenOut(BaseModel):
    """A token as the list answers it: server.api_tokens.token_json's keys, in its order (a
    test holds them equal); never the token itself."""

    id: int
    name: str
    scopes: list[Scope] = Field(description="as created (admin implies the others)")
    created_at: float = Field(description="seconds since the epoch")
    revoked: bool


class NewTokenOut(BaseModel):
    """A token just created: the only answer that carries it."""

    name: str
    scopes: list[Scope]
    token: str = Field(description="the bearer token, shown this once")


class RevokedOut(BaseModel):
    name: str
    revoked: int = Field(description="the live tokens of this name revoked (at least 1)")


@router.get("/tokens", response_model=list[TokenOut], dependencies=[ADMIN])
async def tokens(store: StoreDep) -> list[TokenOut]:
    """Every token's id, name, scopes, creation time and whether it is revoked (never the token)."""
    return [TokenOut.model_validate(token_json(row)) for row in await list_tokens(store)]


@router.post("/tokens", status_code=201, response_model=NewTokenOut, dependencies=[ADMIN], responses=errors(429))
async def new_token(body: TokenIn, store: StoreDep) -> NewTokenOut:
    """The only answer that carries the token: store it now."""
    token = await create_token(store, body.name, list(body.scopes))
    return NewTokenOut(name=body.name, scopes=body.scopes, token=token)


@router.delete("/tokens/{name}", response_model=RevokedOut, dependencies=[ADMIN], responses=errors(404, 429))
async def revoke(name: Annotated[Text, Path(max_length=200)], store: StoreDep) -> RevokedOut:
    """Revoke every live token of this name: refused at once by every route, its open ingest
    and live sockets closed (4401) within `KEEL_TOKEN_RECHECK_S`."""
    count = await revoke_tokens(store, name)
    if not count:
        raise HTTPException(404, f"no live token named {name!r}")
    return RevokedOut(name=name, revoked=count)

"""Commands to a run's trainer (docs/read-api.md, "Commands"; docs/protocol.md, "Signals")."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from server import run_commands
from server.api_tokens import SCOPES, token_name, token_scopes
from server.auth import ADMIN, READ, presented_token
from server.deps import HubDep, SettingsDep, StoreDep
from server.errors import NotTaken, TooManyPending
from server.schemas import ApiRoute, RunId, Scope, Text, errors
from wire import ProtocolError
from wire.messages import parse_config
from wire.signals import ACTION

router = APIRouter(tags=["commands"], route_class=ApiRoute, responses=errors(401))

MAX_PAYLOAD_BYTES = 64 * 1024
"""A command's payload, as JSON, at most."""


class CommandOut(BaseModel):
    """A command as the API answers it: wire.api.ApiCommand's fields, in its order (a test
    holds them equal)."""

    id: str
    run_id: str
    action: str
    payload: dict[str, Any]
    state: str = Field(description="`pending`, `delivered`, `acked` or `failed`")
    requested_by: str = Field(description='the token\'s name, "local" with auth off, or "rule <name>"')
    created_at: float = Field(description="seconds since the epoch, as the times below")
    delivered_at: float | None
    finished_at: float | None
    message: str = Field(description="the handler's answer, or why the command failed without one")
    answered_by: str | None = Field(description="the writer whose trainer answered")


class WhoamiOut(BaseModel):
    """Who a request is (GET /whoami)."""

    auth: bool = Field(description="whether the server checks tokens (false: everyone is admin)")
    name: str | None = Field(description='the token\'s name, "local" with auth off; null for no token or one not live')
    scopes: list[Scope] = Field(description="what it may do, admin's implied ones included; [] for no live token")


class CommandIn(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    action: Annotated[
        str, Field(pattern=f"^{ACTION.pattern}$", description="`checkpoint`, `stop` or a name of your own (1-64 of [A-Za-z0-9_.-])")
    ]
    payload: dict[Text, Any] = Field(default_factory=dict, description="anything the trainer's handler reads (at most 64 KiB of JSON, nesting at most 32 levels, no NUL)")

    @field_validator("payload")
    @classmethod
    def _small(cls, payload: dict[str, Any]) -> dict[str, Any]:
        try:  # as a run's config: at most MAX_CONFIG_DEPTH levels, no NUL in any string
            parse_config(payload, "payload")
        except ProtocolError as exc:
            raise ValueError(str(exc)) from None
        try:
            size = len(orjson.dumps(payload))
        except TypeError as exc:  # an integer past 64 bits, which no trainer's JSON reads back
            raise ValueError(f"payload cannot be sent as JSON: {exc}") from None
        if size > MAX_PAYLOAD_BYTES:
            raise ValueError(f"payload over {MAX_PAYLOAD_BYTES} bytes of JSON")
        return payload


@router.post(
    "/runs/{run_id}/commands", status_code=202, response_model=CommandOut, dependencies=[ADMIN], responses=errors(404, 409, 429)
)
async def send_command(run_id: RunId, body: CommandIn, request: Request, store: StoreDep, hub: HubDep, settings: SettingsDep) -> dict[str, Any]:
    """Ask the run's trainer to do something: `pending` until a writer of the run that listens
    to commands receives it (`delivered`), then `acked` or `failed` as its handler answers.
    A command still pending with the same action is replaced by this one (it becomes `failed`,
    "replaced by …"); a run holds at most `MAX_PENDING` pending commands (429 past it). A
    command no trainer can take is refused (409, nothing stored): the run has ended, or its
    trainer said which actions it takes (the run's `actions`) and this is not one."""
    token = presented_token(request)
    by = (await token_name(store, token) if token and settings.auth_enabled else None) or "local"
    try:
        command = await run_commands.create(store, hub, run_id, body.action, body.payload, by)
    except TooManyPending as exc:
        raise HTTPException(429, str(exc)) from None
    except NotTaken as exc:
        raise HTTPException(409, str(exc)) from None
    return run_commands.command_json(command)  # validated once, as the response model


@router.get("/runs/{run_id}/commands", response_model=list[CommandOut], dependencies=[READ], responses=errors(404))
async def list_commands(run_id: RunId, store: StoreDep) -> list[dict[str, Any]]:
    """The run's commands, newest first (the last 200), with their state and who asked."""
    return [run_commands.command_json(c) for c in await run_commands.list_commands(store, run_id)]


@router.get("/whoami", response_model=WhoamiOut)
async def whoami(request: Request, store: StoreDep, settings: SettingsDep) -> WhoamiOut:
    """Who the request's token (or login cookie) is and what it may do: the run page shows its
    command buttons to an admin only. With auth off, everyone is admin."""
    if not settings.auth_enabled:
        return WhoamiOut.model_validate({"auth": False, "name": "local", "scopes": list(SCOPES)})
    token = presented_token(request)
    scopes = await token_scopes(store, token) if token else None
    name = await token_name(store, token) if token and scopes is not None else None
    return WhoamiOut.model_validate({"auth": True, "name": name, "scopes": sorted(scopes or ())})

"""Commands to a run's trainer: stored, pushed to its listening writers, answered by them.

A command is written `pending` (by `POST /runs/{id}/commands`, or by a rule's action in the
same transaction as the alert that fired it), then published on the hub: every ingest
socket of the run that listens to "commands" (on any replica: the hub relays) sends it and
marks it `delivered`. The trainer's answer makes it `acked` or `failed`. A socket that
starts listening is sent every command of the run not answered yet, so a command reaches a
trainer that was away when it was made, and again one that did not answer before its
connection dropped: at least once, with its id to make a repeat harmless.

A command no trainer can take is not left `pending`: over REST it is refused (409) when the
run has ended or its trainer said which actions it takes and this is not one; a rule's
action is stored `failed` with the same words; and when a run ends, what its trainer had
not answered becomes `failed`, "the run ended before its trainer answered".
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from server.errors import NotTaken, TooManyPending, UnknownRun
from server.live import LiveHub
from server.models import Command, Run
from server.storage import Store
from wire.api import ApiCommand
from wire.signals import Command as WireCommand
from wire.signals import CommandMessage

__all__ = [
    "MAX_PENDING", "add_command", "answer", "command_json", "create", "delivered", "list_commands",
    "publish", "refusal", "replace_pending", "signal_message", "unanswered", "undeliverable",
]

LISTED = 200
"""Commands a run's list shows (the newest)."""
MAX_PENDING = 100
"""Commands a run may hold `pending` (made, not yet received by a trainer): past it a new one
is refused (429), so a run whose trainer does not listen cannot be filled without end."""
PAGE = 50
"""Unanswered commands read and sent at a time to a socket that starts listening (fewer than
MAX_PENDING: a run at its cap is sent in pages)."""


def refusal(run: Run, action: str) -> str | None:
    """Why no trainer of `run` can take `action`, or None when one may."""
    if run.status != "running":
        return f"run {run.id!r} is {run.status}: no trainer is there to take a command"
    if run.actions and action not in run.actions:
        return f"this run's trainer takes {', '.join(sorted(run.actions))}, not {action!r}"
    return None


def add_command(session: AsyncSession, run: Run, action: str, payload: dict[str, Any], requested_by: str, now: float) -> Command:
    """A new command, added to `session` (written with its transaction): pending, or failed
    at once with why when no trainer of the run can take it (`refusal`)."""
    refused = refusal(run, action)
    command = Command(
        id=uuid.uuid4().hex,
        run_id=run.id,
        action=action,
        payload=payload,
        state="pending" if refused is None else "failed",
        requested_by=requested_by[:200],
        created_at=now,
        finished_at=None if refused is None else now,
        message=refused or "",
    )
    session.add(command)
    return command


def _shown(payload: Any) -> Any:
    """A payload as the API can answer it: one that no JSON encoder takes (nested past
    orjson's limit, stored before payloads were judged) is replaced by a note saying so."""
    try:
        orjson.dumps(payload)
    except TypeError as exc:
        return {"unreadable": f"this payload cannot be sent as JSON ({exc})"}
    return payload


def command_json(command: Command) -> dict[str, Any]:
    """The API shape of a command (REST and the run page): wire.api.ApiCommand."""
    return ApiCommand(
        id=command.id, run_id=command.run_id, action=command.action, payload=_shown(command.payload),
        state=command.state, requested_by=command.requested_by, created_at=command.created_at,
        delivered_at=command.delivered_at, finished_at=command.finished_at, message=command.message,
        answered_by=command.answered_by,
    ).to_json()  # fmt: skip


def signal_message(command: Command) -> CommandMessage:
    """What a listening trainer is sent (docs/protocol.md, "Signals")."""
    return CommandMessage(command.run_id, WireCommand(
        command.id, command.action, dict(command.payload), command.requested_by, command.created_at
    ))


def publish(hub: LiveHub, commands: list[Command]) -> None:
    """To the run's listening sockets, on every replica (after the commit)."""
    for command in commands:
        if command.state == "pending":
            hub.publish(command.run_id, signal_message(command).to_json())


async def replace_pending(session: AsyncSession, command: Command, now: float) -> int:
    """Mark the run's other pending commands of `command`'s action `failed`, "replaced by
    <id>": a trainer that comes back gets the newest, once (REST and rules' actions alike).
    How many it replaced."""
    replaced = await session.execute(
        update(Command)
        .where(Command.run_id == command.run_id, Command.action == command.action, Command.state == "pending", Command.id != command.id)
        .values(state="failed", finished_at=now, message=f"replaced by {command.id} before a trainer received it")
    )
    return int(getattr(replaced, "rowcount", 0) or 0)


async def create(store: Store, hub: LiveHub, run_id: str, action: str, payload: dict[str, Any], requested_by: str) -> Command:
    """A new pending command. One still pending with the same action is replaced (marked
    `failed`, "replaced by <id>": a trainer that comes back gets the newest `stop`, once);
    TooManyPending when the run holds MAX_PENDING pending commands of other actions; NotTaken
    (nothing stored) when no trainer of the run can take it."""
    now = time.time()
    async with store.writing() as session:
        run = await session.get(Run, run_id)
        if run is None:
            raise UnknownRun(run_id)
        refused = refusal(run, action)
        if refused is not None:
            raise NotTaken(refused)
        command = add_command(session, run, action, payload, requested_by, now)
        if not await replace_pending(session, command, now):
            pending = await session.scalar(
                select(func.count()).select_from(Command).where(Command.run_id == run_id, Command.state == "pending")
            )
            if (pending or 0) > MAX_PENDING:  # the new one is counted: it is in the session
                raise TooManyPending(f"run {run_id!r} has {MAX_PENDING} commands pending already (its trainer is not taking them)")
    publish(hub, [command])
    return command


async def list_commands(store: Store, run_id: str) -> list[Command]:
    async with store.sessions() as session:
        if await session.get(Run, run_id) is None:
            raise UnknownRun(run_id)
        query = select(Command).where(Command.run_id == run_id).order_by(Command.created_at.desc()).limit(LISTED)
        return list((await session.scalars(query)).all())


async def unanswered(store: Store, run_id: str, *, after: tuple[float, str] | None = None, limit: int = PAGE) -> list[Command]:
    """A page of the run's commands not answered yet, oldest first, after the (created_at, id)
    of the last one of the previous page (sent to a socket that starts listening)."""
    async with store.sessions() as session:
        query = select(Command).where(Command.run_id == run_id, Command.state.in_(("pending", "delivered")))
        if after is not None:
            created_at, command_id = after
            query = query.where(
                (Command.created_at > created_at) | ((Command.created_at == created_at) & (Command.id > command_id))
            )
        return list((await session.scalars(query.order_by(Command.created_at, Command.id).limit(limit))).all())


async def undeliverable(store: Store, command_id: str, reason: str, now: float) -> None:
    """A command no trainer can be sent (its message cannot be encoded): `failed`, with why."""
    async with store.writing() as session:
        await session.execute(
            update(Command)
            .where(Command.id == command_id, Command.state.in_(("pending", "delivered")))
            .values(state="failed", finished_at=now, message=f"cannot be sent to a trainer: {reason}"[:500])
        )


async def delivered(store: Store, ids: list[str], now: float) -> None:
    """Pending -> delivered (a command answered meanwhile keeps its answer)."""
    if not ids:
        return
    async with store.writing() as session:
        await session.execute(
            update(Command).where(Command.id.in_(ids), Command.state == "pending").values(state="delivered", delivered_at=now)
        )


async def answer(store: Store, run_id: str, command_id: str, ok: bool, message: str, now: float, *, by: str | None = None) -> bool:
    """Record the trainer's answer; False when the run has no such command. The first answer
    stands: a repeat (the command was delivered twice) changes nothing."""
    async with store.writing() as session:
        result = await session.execute(
            update(Command)
            .where(Command.id == command_id, Command.run_id == run_id, Command.state.in_(("pending", "delivered")))
            .values(state="acked" if ok else "failed", finished_at=now, message=message, answered_by=by)
        )
        return bool(getattr(result, "rowcount", 0))

"""Request-scoped dependencies as Annotated aliases, all read from the process's `Services`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from server.alerts.rulebook import RuleBook
from server.config import Settings
from server.ingest import AfterCommit, IngestSlots
from server.live import LiveHub
from server.services import Services
from server.storage import Store
from server.webhooks.delivery import DeliveryWorker


def get_services(conn: HTTPConnection) -> Services:
    """Set once by the lifespan (server.app)."""
    return conn.app.state.services  # type: ignore[no-any-return]


def get_store(conn: HTTPConnection) -> Store:
    return get_services(conn).store


def get_settings(conn: HTTPConnection) -> Settings:
    return get_services(conn).settings


def get_hub(conn: HTTPConnection) -> LiveHub:
    return get_services(conn).hub


def get_committed(conn: HTTPConnection) -> AfterCommit:
    return get_services(conn).committed


def get_rulebook(conn: HTTPConnection) -> RuleBook:
    return get_services(conn).rulebook


def get_deliveries(conn: HTTPConnection) -> DeliveryWorker:
    return get_services(conn).deliveries


def get_ingest_slots(conn: HTTPConnection) -> IngestSlots:
    return get_services(conn).ingest_slots


ServicesDep = Annotated[Services, Depends(get_services)]
StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
HubDep = Annotated[LiveHub, Depends(get_hub)]
CommittedDep = Annotated[AfterCommit, Depends(get_committed)]
RuleBookDep = Annotated[RuleBook, Depends(get_rulebook)]
DeliveriesDep = Annotated[DeliveryWorker, Depends(get_deliveries)]
IngestSlotsDep = Annotated[IngestSlots, Depends(get_ingest_slots)]

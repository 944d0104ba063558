"""Request-scoped dependencies as Annotated aliases, all read from the process's `Components`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from server.alerts.hazard import HazardModel
from server.alerts.rulebook import RuleBook
from server.components import Components
from server.config import Settings
from server.ingest import AfterCommit, IngestSlots
from server.live import LiveHub
from server.storage import Store
from server.webhooks.delivery import DeliveryWorker


def get_components(conn: HTTPConnection) -> Components:
    """Set once by the lifespan (server.app)."""
    return conn.app.state.components  # type: ignore[no-any-return]


def get_store(conn: HTTPConnection) -> Store:
    return get_components(conn).store


def get_settings(conn: HTTPConnection) -> Settings:
    return get_components(conn).settings


def get_hub(conn: HTTPConnection) -> LiveHub:
    return get_components(conn).hub


def get_committed(conn: HTTPConnection) -> AfterCommit:
    return get_components(conn).committed


def get_rulebook(conn: HTTPConnection) -> RuleBook:
    return get_components(conn).rulebook


def get_deliveries(conn: HTTPConnection) -> DeliveryWorker:
    return get_components(conn).deliveries


def get_ingest_slots(conn: HTTPConnection) -> IngestSlots:
    return get_components(conn).ingest_slots


def get_hazard_model(conn: HTTPConnection) -> HazardModel:
    return get_components(conn).hazard_model


ComponentsDep = Annotated[Components, Depends(get_components)]
StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
HubDep = Annotated[LiveHub, Depends(get_hub)]
CommittedDep = Annotated[AfterCommit, Depends(get_committed)]
RuleBookDep = Annotated[RuleBook, Depends(get_rulebook)]
DeliveriesDep = Annotated[DeliveryWorker, Depends(get_deliveries)]
IngestSlotsDep = Annotated[IngestSlots, Depends(get_ingest_slots)]
HazardModelDep = Annotated[HazardModel, Depends(get_hazard_model)]

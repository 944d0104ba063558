"""Request-scoped dependencies as Annotated aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from server.config import Settings
from server.live import LiveHub
from server.storage import Store


def get_store(conn: HTTPConnection) -> Store:
    return conn.app.state.store  # type: ignore[no-any-return]


def get_settings(conn: HTTPConnection) -> Settings:
    return conn.app.state.settings  # type: ignore[no-any-return]


def get_hub(conn: HTTPConnection) -> LiveHub:
    return conn.app.state.hub  # type: ignore[no-any-return]


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
HubDep = Annotated[LiveHub, Depends(get_hub)]

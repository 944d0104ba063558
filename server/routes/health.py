"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from server.deps import StoreDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "The database is unreachable: `{\"status\": \"unavailable\", \"detail\"}`"}})
async def readyz(store: StoreDep) -> JSONResponse:
    try:
        await store.ping()
    except Exception as exc:
        return JSONResponse({"status": "unavailable", "detail": type(exc).__name__}, status_code=503)
    return JSONResponse({"status": "ok"})

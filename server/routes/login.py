"""Dashboard login by token (only when auth is on): a form that sets an HttpOnly cookie."""

from __future__ import annotations

from html import escape
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from server.api_tokens import token_scopes
from server.auth import COOKIE
from server.deps import StoreDep

router = APIRouter(include_in_schema=False)

PAGE = """<!doctype html><html><head><title>Keel: sign in</title>
<style>body{{font-family:system-ui,sans-serif;background:#0f1115;color:#e6e6e6;display:grid;place-items:center;height:100vh;margin:0}}
form{{background:#181b22;padding:2rem;border-radius:8px;width:22rem}}input{{width:100%;padding:.5rem;margin:.5rem 0 1rem;box-sizing:border-box}}
button{{padding:.5rem 1rem}}.err{{color:#ff6b6b}}</style></head>
<body><form method="post" action="/login"><h2>Keel</h2><label>API token (read scope)</label>
<input name="token" type="password" autofocus autocomplete="current-password"><p class="err">{error}</p>
<button type="submit">Sign in</button></form></body></html>"""


@router.get("/login")
async def login_form() -> HTMLResponse:
    return HTMLResponse(PAGE.format(error=""))


@router.post("/login")
async def login(request: Request, store: StoreDep) -> Response:
    token = parse_qs((await request.body()).decode(errors="replace")).get("token", [""])[0].strip()
    scopes = await token_scopes(store, token) if token else None
    if not scopes or "read" not in scopes:
        return HTMLResponse(PAGE.format(error=escape("That token is unknown or lacks the read scope.")), status_code=401)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="lax", secure=request.url.scheme == "https")
    return response


@router.post("/logout")
async def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE)
    return response

"""The admin console pages: sign in with the admin token, then one page that drives the admin API."""

from __future__ import annotations

import hmac
import time
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from app.api.deps import RuntimeDep
from app.core.auth import SESSION_COOKIE, SESSION_SECONDS, csrf_token, new_session, token_matches

CONSOLE_DIR = Path(__file__).resolve().parents[2] / "console"  # app/console
templates = Jinja2Templates(directory=CONSOLE_DIR / "templates")
router = APIRouter(prefix="/admin", tags=["console"], include_in_schema=False)


@router.get("", response_class=HTMLResponse)
def console(request: Request, rt: RuntimeDep) -> Response:
    cookie = request.cookies.get(SESSION_COOKIE)
    if not rt.console_sessions.valid(rt.admin_token, cookie):
        return RedirectResponse("/admin/login", status_code=303)
    assert cookie is not None
    return templates.TemplateResponse(request, "console.html", {"csrf": csrf_token(rt.admin_token, cookie)})


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request) -> Response:
    return templates.TemplateResponse(request, "login.html", {"error": None})


@router.post("/login")
async def login(request: Request, rt: RuntimeDep) -> Response:
    form = await request.form()
    token = str(form.get("token") or "")
    if not token_matches(rt.admin_token, f"Bearer {token}"):
        return templates.TemplateResponse(request, "login.html", {"error": "That is not the admin token."}, 401)
    response = RedirectResponse("/admin", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        new_session(rt.admin_token, time.time()),
        max_age=SESSION_SECONDS,
        httponly=True,
        samesite="strict",  # the browser never sends it on another site's request
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
async def logout(request: Request, rt: RuntimeDep) -> Response:
    cookie = request.cookies.get(SESSION_COOKIE) or ""
    form = await request.form()
    if cookie and hmac.compare_digest(str(form.get("csrf") or ""), csrf_token(rt.admin_token, cookie)):
        if rt.console_sessions.valid(rt.admin_token, cookie):
            rt.console_sessions.revoke(cookie)  # the cookie is dead everywhere, not only in this browser
        response = RedirectResponse("/admin/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response
    return RedirectResponse("/admin", status_code=303)

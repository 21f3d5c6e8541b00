"""Who is signed in to the console, and the sign-in and sign-out pages.

Every page takes a :class:`Viewer` (the cookie's user). A request that changes something also
passes the CSRF check (the session's secret, sent back by each form and htmx request; the
cookie is SameSite=Strict as well) and the same token-scope rule as the API route it mirrors
(:func:`Viewer.may`), so a read-only token stays read-only here too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Form, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response

from deeppod.api.deps import SessionDep
from deeppod.auth.roles import check_route
from deeppod.auth.service import Principal
from deeppod.errors import DeepPodError, Forbidden
from deeppod.ui import sessions
from deeppod.ui.render import ConsoleRoute, page

COOKIE = "deeppod_console"
CSRF_FIELD, CSRF_HEADER = "csrf", "x-csrf-token"
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_FORM_BYTES = 1 << 20


@dataclass
class Viewer:
    principal: Principal
    csrf: str

    def may(self, method: str, api_route: str, **params) -> None:
        """The API's scope rule for the route this console action mirrors."""
        check_route(self.principal, method, api_route, {k: str(v) for k, v in params.items()})

    def can(self, method: str, api_route: str, **params) -> bool:
        try:
            self.may(method, api_route, **params)
            return True
        except Forbidden:
            return False


async def get_viewer(request: Request) -> Viewer:
    ctx = request.app.state.ctx
    who = await run_in_threadpool(_signed_in, ctx, request.cookies.get(COOKIE))
    if request.method in UNSAFE:
        given = request.headers.get(CSRF_HEADER)
        if given is None and _small_form(request):
            await request.body()  # kept: the handler can still read the form (or the stream) after this
            given = (await request.form()).get(CSRF_FIELD)
        if not sessions.csrf_ok(who.csrf, given if isinstance(given, str) else None):
            raise Forbidden("this form is stale or did not come from the console: reload the page and try again")
    viewer = Viewer(who.principal, who.csrf)
    request.state.viewer = viewer
    request.state.principal = who.principal  # the audit log's 'who'
    return viewer


def _signed_in(ctx, cookie: str | None) -> sessions.SignedIn:
    """A short read-only session of its own, like the API's token check, off the event loop."""
    with ctx.read_sessions() as s:
        return sessions.signed_in(s, cookie)


def _small_form(request: Request) -> bool:
    """A page's own form (urlencoded, small): its CSRF field may be read before the handler.
    Scripts (uploads, predictions) send the header instead."""
    try:
        size = int(request.headers.get("content-length", ""))
    except ValueError:
        return False
    return request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded") and \
        size <= MAX_FORM_BYTES


ViewerDep = Annotated[Viewer, Depends(get_viewer)]

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


def _safe_next(target: str | None) -> str:
    """Only a path on this server: never an open redirect."""
    parts = urlsplit(target or "")
    if not target or parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return "/jobs"
    return target


@router.get("/login")
def login_page(request: Request, next: str = "/jobs") -> Response:
    return page(request, "login.html", next=_safe_next(next), error=None)


@router.post("/login")
def login(request: Request, session: SessionDep, token: Annotated[str, Form()] = "",
          next: Annotated[str, Form()] = "/jobs") -> Response:
    _same_origin(request)
    try:
        secret, who = sessions.sign_in(session, token)
    except DeepPodError as exc:
        return page(request, "login.html", status=exc.status, next=_safe_next(next), error=exc.message)
    request.state.principal = who.principal
    response = RedirectResponse(_safe_next(next), status_code=303)
    response.set_cookie(COOKIE, secret, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https", max_age=int(sessions.LIFETIME.total_seconds()))
    return response


@router.post("/logout")
def logout(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    sessions.sign_out(session, request.cookies.get(COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    if request.headers.get("hx-request"):
        response.headers["HX-Redirect"] = "/login"
    return response


def _same_origin(request: Request) -> None:
    """Sign-in has no session to hold a CSRF secret yet: refuse a form posted from elsewhere
    (login CSRF would sign the victim in as the attacker)."""
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise Forbidden("sign in from the console's own page")


"""Pages: the Jinja2 environment, the filters the templates share, and the route class that
turns every error a page raises into a page (never a JSON body, never a 5xx for bad input)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.resources import files
from urllib.parse import quote

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, select_autoescape

from deeppod.contract import JobState
from deeppod.errors import DeepPodError, InvalidRequest, Rerender, Unauthenticated
from deeppod.units import duration_text, size_text

log = logging.getLogger(__name__)

TEMPLATES = files("deeppod.ui") / "templates"
STATIC = files("deeppod.ui") / "static"

env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html"]),
                  trim_blocks=True, lstrip_blocks=True)


def _ago(value: datetime | None) -> str:
    """'3m', '2h 5m', '4d': how long ago, for tables."""
    if value is None:
        return ""
    s = int((datetime.now(UTC) - value).total_seconds())
    if s < 60:
        return f"{max(s, 0)}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d"


def _span(seconds: float | None) -> str:
    """'45s', '12m 03s', '2h 05m': a duration."""
    s = int(seconds or 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def _when(value: datetime | None) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S} UTC" if value else ""


# the colours a state badge has (console.css); a search's or deployment's state borrows a job's
_BADGES = {state.value for state in JobState}
_BADGE_OF = {"completed": "succeeded", "ready": "succeeded"}


def _badge(state) -> str:
    """The CSS class of a job's, trial's, search's or deployment's state: ``s-running``."""
    value = str(getattr(state, "value", state))
    value = _BADGE_OF.get(value, value)
    return "s-" + (value if value in _BADGES else "queued")


env.filters["ago"] = _ago
env.filters["badge"] = _badge
env.filters["when"] = _when
env.filters["span"] = _span
env.filters["size"] = size_text
env.filters["limit"] = duration_text


def page(request: Request, template: str, status: int = 200, **values) -> HTMLResponse:
    """A whole page, or just its ``content`` block for an htmx request that asks for a part."""
    viewer = getattr(request.state, "viewer", None)
    body = env.get_template(template).render(request=request, viewer=viewer, **values)
    return HTMLResponse(body, status_code=status)


def page_number(request: Request) -> int:
    """The ?page= of a paged table (1 when absent)."""
    raw = request.query_params.get("page", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidRequest(f"page {raw!r} is not a page number: use 1, 2, ...")
    return int(raw)


def fragment(template: str, **values) -> HTMLResponse:
    return HTMLResponse(env.get_template(template).render(**values))


def sign_in_redirect(request: Request) -> Response:
    target = "/login?next=" + quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    if request.headers.get("hx-request"):
        return Response(status_code=401, headers={"HX-Redirect": target})
    return RedirectResponse(target, status_code=303)


class ConsoleRoute(APIRoute):
    """Errors become pages: a refused or bad request shows what to fix, with its status; a
    session that ended goes back to the sign-in page."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Rerender as again:
                return again.response
            except Unauthenticated:
                return sign_in_redirect(request)
            except DeepPodError as exc:
                if exc.status >= 500:
                    log.error("%s: %s", exc.code, exc.message)
                return error_page(request, exc.status, exc.message, exc.code)
            except RequestValidationError as exc:
                what = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:])}: {e.get('msg')}"
                                 for e in exc.errors())
                return error_page(request, 422, f"this page's address is not valid ({what})")

        return route


def error_page(request: Request, status: int, message: str, code: str = "invalid_request") -> Response:
    if "application/json" in request.headers.get("accept", ""):  # the page's own scripts (an upload)
        return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)
    if request.headers.get("hx-request"):  # shown where the part would have gone
        return HTMLResponse(f'<p class="error" role="alert">{_escape(message)}</p>', status_code=status)
    return page(request, "error.html", status=status, status_code=status, message=message)


def _escape(text: str) -> str:
    from markupsafe import escape

    return str(escape(text))

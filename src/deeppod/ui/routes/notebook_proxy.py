"""``/notebooks/ID/``: the one way to a notebook's JupyterLab, HTTP and WebSocket (kernels,
terminals), for its owner or an administrator, signed in to the console (its cookie) or sending
a token (``Authorization: Bearer``). Anyone else gets 404, nobody signed in 401 (a browser is
sent to sign in). The notebook's Jupyter server listens on a unix socket in its own folder
(notebooks/upstream.py); the proxy connects there, sends the token only it knows and strips the
console's cookie and the caller's token on the way. Calls that change something are in the
audit log as any API call; each WebSocket opened is recorded too.

In the console's package because the console's session signs a browser in here; it reads no
console page and calls the notebooks service only."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import h11
from fastapi import APIRouter, Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from deeppod.api.deps import bearer
from deeppod.audit.log import Entry
from deeppod.auth.roles import check_runs_code
from deeppod.auth.service import Principal
from deeppod.auth.tokens import notebook_secret
from deeppod.contract import FINAL_STATES, JobState
from deeppod.errors import DeepPodError, Forbidden, Unavailable
from deeppod.notebooks import service, upstream
from deeppod.ui import sessions
from deeppod.ui.auth import COOKIE

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# not passed on: the connection's own, and the caller's credentials (the notebook gets its own token)
HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "authorization",
                 "cookie", "transfer-encoding", "content-length"})
CHUNK = 1 << 16


@dataclass
class Reached:
    principal: Principal
    job_id: int
    workdir: str


def _principal(ctx, token: str | None, cookie: str | None) -> Principal:
    if token:
        principal = ctx.principals.get(token)
    else:
        with ctx.read_sessions() as s:
            principal = sessions.signed_in(s, cookie).principal
    if principal.job_id is None:
        check_runs_code(principal, "a notebook")
    return principal


def _reach(ctx, job_id: int, token: str | None, cookie: str | None) -> Reached:
    """Who asks, and the running notebook they may reach (blocking: the store)."""
    principal = _principal(ctx, token, cookie)
    with ctx.read_sessions() as s:
        job = service.reachable(s, principal, job_id)
        if job.state != JobState.RUNNING:
            why = f": {job.reason}" if job.reason and job.state == JobState.QUEUED else ""
            raise Unavailable(f"notebook {job_id} is {job.state}{why}" + (
                f"; 'deeppod notebook start --resume {job_id}' brings it back" if job.state == JobState.STOPPED
                else "; it opens here once it runs" if job.state not in FINAL_STATES else ""))
        return Reached(principal, job.id, job.workdir)


def _refusal(request: Request, exc: DeepPodError, job_id: int) -> Response:
    """A browser is shown a page (sent to sign in, or told to wait); a client gets the API's error."""
    if "text/html" not in request.headers.get("accept", ""):
        return JSONResponse({"error": {"code": exc.code, "message": exc.message}}, status_code=exc.status)
    if exc.status == 401:
        return RedirectResponse(f"/login?next={quote(service.url(job_id))}", status_code=303)
    refresh = '<meta http-equiv="refresh" content="5">' if exc.status == 503 else ""
    text = exc.message.replace("&", "&amp;").replace("<", "&lt;")
    return HTMLResponse(f"<!doctype html><title>Notebook {job_id}</title>{refresh}<p>{text}</p>"
                        f'<p><a href="/notebooks">Notebooks</a></p>', status_code=exc.status)


@router.get("/notebooks/{job_id:int}")
async def notebook_root(job_id: int) -> Response:
    return RedirectResponse(service.url(job_id), status_code=307)


@router.api_route("/notebooks/{job_id:int}/{path:path}", methods=METHODS)
async def forward(request: Request, job_id: int, path: str) -> Response:
    ctx = request.app.state.ctx
    try:
        reached = await run_in_threadpool(_reach, ctx, job_id, bearer(request), request.cookies.get(COOKIE))
        request.state.principal = reached.principal  # the audit log's 'who'
        sock = await run_in_threadpool(upstream.connect, reached.workdir)
    except DeepPodError as exc:
        return _refusal(request, exc, job_id)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=CHUNK)
    try:
        return await _exchange(request, job_id, reader, writer)
    except (OSError, h11.ProtocolError, asyncio.IncompleteReadError) as exc:
        writer.close()
        return _refusal(request, Unavailable(f"notebook {job_id}'s server broke off: {exc}"), job_id)


def _upstream_headers(request: Request, job_id: int) -> list[tuple[str, str]]:
    headers = [(k, v) for k, v in request.headers.items() if k not in HOP]
    cookies = [c for c in request.headers.get("cookie", "").split(";") if c.strip() and
               c.strip().partition("=")[0] != COOKIE]
    if cookies:
        headers.append(("cookie", ";".join(cookies)))
    headers += [("authorization", f"token {notebook_secret(job_id)}"), ("connection", "close")]
    return headers


async def _exchange(request: Request, job_id: int, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> Response:
    conn = h11.Connection(h11.CLIENT)
    target = request.scope.get("raw_path", request.url.path.encode()) + (
        b"?" + request.scope["query_string"] if request.scope.get("query_string") else b"")
    headers = _upstream_headers(request, job_id)
    length = request.headers.get("content-length")
    if length is not None:
        headers.append(("content-length", length))
    elif request.method not in ("GET", "HEAD", "OPTIONS", "DELETE"):
        headers.append(("transfer-encoding", "chunked"))
    writer.write(conn.send(h11.Request(method=request.method, target=target, headers=headers)))
    async for chunk in request.stream():
        if chunk:
            writer.write(conn.send(h11.Data(data=chunk)))
            await writer.drain()
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()
    head = await _next(conn, reader)
    while isinstance(head, h11.InformationalResponse):
        head = await _next(conn, reader)
    out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in head.headers
           if k.decode("latin-1").lower() not in ("connection", "keep-alive", "transfer-encoding")]

    async def body():
        try:
            while True:
                event = await _next(conn, reader)
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    return
        finally:
            writer.close()

    response = StreamingResponse(body(), status_code=head.status_code)
    response.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in out]
    return response


async def _next(conn: h11.Connection, reader: asyncio.StreamReader):
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(CHUNK))
            continue
        return event


@router.websocket("/notebooks/{job_id:int}/{path:path}")
async def forward_socket(websocket: WebSocket, job_id: int, path: str) -> None:
    """A kernel's or a terminal's WebSocket, message by message both ways."""
    ctx = websocket.app.state.ctx
    origin, host = websocket.headers.get("origin"), websocket.headers.get("host", "")
    try:
        if origin and urlsplit(origin).netloc != host:  # another site's page cannot drive a signed-in browser
            raise Forbidden("a notebook's sockets are opened from the console's own pages")
        reached = await run_in_threadpool(_reach, ctx, job_id, bearer(websocket), websocket.cookies.get(COOKIE))
        sock = await run_in_threadpool(upstream.connect, reached.workdir)
    except DeepPodError as exc:
        await websocket.send_denial_response(JSONResponse({"error": {"code": exc.code, "message": exc.message}},
                                                          status_code=exc.status))
        return
    query = websocket.scope.get("query_string", b"").decode("latin-1")
    uri = f"ws://{host or 'localhost'}{websocket.url.path}" + (f"?{query}" if query else "")
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    try:
        up = await ws_connect(uri, sock=sock, subprotocols=offered or None, compression=None, max_size=None,
                              additional_headers={"Authorization": f"token {notebook_secret(job_id)}"},
                              open_timeout=10, ping_interval=None)
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        sock.close()
        await websocket.send_denial_response(JSONResponse(
            {"error": {"code": "unavailable", "message": f"notebook {job_id}'s server refused the socket: {exc}"}},
            status_code=502))
        return
    client = websocket.client
    p = reached.principal
    ctx.audit.record(Entry("WEBSOCKET", websocket.url.path[:512], 101, client.host[:64] if client else "",
                           p.user, p.tenant, "user"))
    await websocket.accept(subprotocol=up.subprotocol)
    await _pump(websocket, up)


async def _pump(websocket: WebSocket, up) -> None:
    async def inward():
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is not None:
                await up.send(message["text"])
            elif message.get("bytes") is not None:
                await up.send(message["bytes"])

    async def outward():
        try:
            async for message in up:
                if isinstance(message, str):
                    await websocket.send_text(message)
                else:
                    await websocket.send_bytes(message)
        except ConnectionClosed:
            pass

    tasks = [asyncio.create_task(inward()), asyncio.create_task(outward())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await up.close()
        try:
            await websocket.close(code=up.close_code or 1000)
        except RuntimeError:  # the browser had closed it already
            pass

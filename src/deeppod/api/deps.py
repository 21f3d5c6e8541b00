"""Request dependencies: the server context, a DB session per request, the caller.

They are coroutines: what they do without I/O (a session object, a cached token) costs no
trip through the thread pool; what blocks (a commit, a token looked up) goes there.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from deeppod.auth.roles import READ_METHODS, check_route
from deeppod.auth.service import Principal, authenticate
from deeppod.models import service as models


def get_ctx(request: Request):
    return request.app.state.ctx


def submit_options(request: Request) -> dict:
    """The server's side of a submission (jobs.service.submit's keywords past the request):
    one place for every route that submits, through the API or the console."""
    ctx = request.app.state.ctx
    s = ctx.settings
    return {"default_grace": s.grace_seconds, "roots": ctx.roots, "code": ctx.code, "jobs_dir": s.jobs_dir,
            "default_network": s.job_network, "image_dir": s.image_dir, "default_pids": s.pids_per_worker,
            "package_index": s.env_index, "resolve_models": functools.partial(models.resolve_for_job,
                                                                              root=s.models_dir)}


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One transaction per request: committed when the handler returns, rolled back on error.
    A GET's reads (store/db.read_only: beside the writer on SQLite, autocommit on PostgreSQL;
    it cannot write): nothing to commit, and closing it only gives its connection back, at
    once, with no round trip to the database."""
    ctx = request.app.state.ctx
    if request.method in READ_METHODS:
        session = ctx.read_sessions()
        try:
            yield session
        finally:
            session.close()
        return
    session = ctx.sessions()
    try:
        yield session
    except BaseException:
        await run_in_threadpool(_discard, session)
        raise
    await run_in_threadpool(_commit, session)  # one trip through the thread pool, not two


def _commit(session: Session) -> None:
    try:
        session.commit()
    finally:
        session.close()


def _discard(session: Session) -> None:
    try:
        session.rollback()
    finally:
        session.close()


# scope="function": commit before the response is sent. With the default ("request") the
# commit ran after the client had its answer, so an immediate GET could miss what a POST
# had just created (seen as a flaky 404 in tests/e2e/test_reclaim.py), and a failed commit
# went unreported.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def bearer(request: HTTPConnection) -> str | None:
    """The bearer token of a request or a WebSocket's handshake, if it has one."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def get_principal(request: Request, session: SessionDep) -> Principal:
    """Who calls. A read's token is looked up at most every half second (auth/cache.py: a
    revoked token reads for at most that long; one revoked on this server at once); a
    change's is checked in the store each time (:func:`principal_now`)."""
    if request.method in READ_METHODS:
        principal = request.app.state.ctx.principals.fresh(bearer(request))
        if principal is not None:  # no trip through the thread pool
            return _admitted(request, principal)
    return await run_in_threadpool(principal_now, request, session)


def principal_now(request: Request, session: Session | None = None) -> Principal:
    """:func:`get_principal`, blocking (for a handler that decides whether it needs one).
    A change's token is read in the request's own transaction (``session``) on PostgreSQL:
    no second session and its round trips. On SQLite that transaction holds the one
    writer's turn from its first statement, so the token is read beside it instead: a caller
    with a bad token never waits for, or holds, the writer."""
    ctx = request.app.state.ctx
    if request.method in READ_METHODS:
        return _admitted(request, ctx.principals.get(bearer(request)))
    if session is not None and ctx.engine.dialect.name != "sqlite":
        return _admitted(request, authenticate(session, bearer(request)))
    with ctx.read_sessions() as own:
        return _admitted(request, authenticate(own, bearer(request)))


def _admitted(request: Request, principal: Principal) -> Principal:
    route = request.scope.get("route")
    check_route(principal, request.method, getattr(route, "path", request.url.path), request.path_params)
    request.state.principal = principal  # for the audit log
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]

# A row id in a path: what the database can hold (a larger number is a 422, not an overflow).
Id = Annotated[int, Path(ge=1, le=2**63 - 1)]

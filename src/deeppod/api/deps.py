"""Request dependencies: the server context, a DB session per request, the caller."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlalchemy.orm import Session

from deeppod.auth.roles import check_route
from deeppod.auth.service import Principal, authenticate


def get_ctx(request: Request):
    return request.app.state.ctx


def get_session(request: Request) -> Iterator[Session]:
    """One transaction per request: committed when the handler returns, rolled back on error."""
    with request.app.state.ctx.sessions.begin() as session:
        yield session


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def get_principal(request: Request) -> Principal:
    # A short session of its own, so auth never holds the request's transaction open.
    with request.app.state.ctx.sessions() as session:
        principal = authenticate(session, bearer(request))
    route = request.scope.get("route")
    check_route(principal, request.method, getattr(route, "path", request.url.path), request.path_params)
    request.state.principal = principal  # for the audit log
    return principal


# scope="function": commit before the response is sent. With the default ("request") the
# commit ran after the client had its answer, so an immediate GET could miss what a POST
# had just created (seen as a flaky 404 in tests/e2e/test_reclaim.py), and a failed commit
# went unreported.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
PrincipalDep = Annotated[Principal, Depends(get_principal)]

# A row id in a path: what the database can hold (a larger number is a 422, not an overflow).
Id = Annotated[int, Path(ge=1, le=2**63 - 1)]

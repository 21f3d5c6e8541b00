"""The one place that turns errors into HTTP responses: ``{"error": {"code", "message"}}``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from deeppod.errors import DeepPodError

log = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _describe(err: dict) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
    if err.get("type") == "extra_forbidden":
        return f"unknown field '{loc}': remove it (the fields this call takes are listed at /docs)"
    if err.get("type") == "missing":
        return f"field '{loc}' is required"
    return f"field '{loc}': {err.get('msg', 'is not valid')}"


def install(app: FastAPI) -> None:
    @app.exception_handler(DeepPodError)
    async def _deeppod(_req: Request, exc: DeepPodError) -> JSONResponse:
        if exc.status >= 500:
            log.error("%s: %s", exc.code, exc.message)
        return error_response(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        bad_json = [e for e in errors if e.get("type") == "json_invalid"]
        if bad_json:
            ctx = bad_json[0].get("ctx", {})
            return error_response(400, "malformed_json",
                                  f"the request body is not valid JSON ({ctx.get('error', 'parse error')}); "
                                  "send a JSON object")
        return error_response(422, "invalid_request", "; ".join(_describe(e) for e in errors))

    @app.exception_handler(HTTPException)
    async def _http(_req: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error_response(500, "internal", "the server hit an unexpected error; see the server log")

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
    async def _http(req: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = str(exc.detail)
        allow = (exc.headers or {}).get("Allow")
        if exc.status_code == 405 and allow:
            message = f"{req.method} is not a method of {req.url.path}; it takes {allow}"
        response = error_response(exc.status_code, code, message)
        response.headers.update(exc.headers or {})  # 405's Allow, above all
        return response

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error_response(500, "internal", "the server hit an unexpected error; see the server log")


_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message"],
    "properties": {"code": {"type": "string", "description": "stable, for programs"},
                   "message": {"type": "string", "description": "for people: what to fix"}}}}}
_WHY = {400: "the body is not valid JSON", 401: "no token, or an unknown, revoked or expired one",
        403: "the token's role, scope or tenant does not allow this", 404: "no such resource (or not the caller's)",
        405: "not a method of this path (the Allow header lists them)", 409: "the resource's state does not allow it",
        413: "the body is over the limit", 422: "a field is missing or not valid"}


def document(app: FastAPI) -> None:
    """Write into the OpenAPI schema the error answers each operation can give, in the one
    error shape, so clients and schema-driven tests know them."""
    original = app.openapi

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = _ERROR
        for path, ops in schema.get("paths", {}).items():
            for method, op in ops.items():
                codes = {405}
                if path.startswith("/v1/"):
                    codes |= {401, 403}
                if "{" in path or "requestBody" in op:  # a path, or a body, names something
                    codes.add(404)
                if method in ("post", "put", "patch", "delete"):
                    codes |= {409, 413}
                if "requestBody" in op:
                    codes.add(400)
                if "requestBody" in op or op.get("parameters"):
                    codes.add(422)
                for code in sorted(codes):
                    op.setdefault("responses", {})[str(code)] = {
                        "description": _WHY[code],
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi

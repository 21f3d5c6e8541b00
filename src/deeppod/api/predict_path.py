"""Predict, outside FastAPI's routing: ``POST /v1/deployments/{name}/predict`` goes from the
ASGI scope straight to the same authorization and forwarding the route uses
(routers/deployments.py), skipping the route matching, dependency solving and response
validation every other call pays (about a quarter of the control plane's CPU per prediction,
measured). The route stays declared for the API docs and behaves the same."""

from __future__ import annotations

import logging

from starlette.requests import Request

from deeppod.api.deps import get_ctx
from deeppod.api.errors import error_response
from deeppod.api.routers.deployments import PREDICT_PATH, authorize
from deeppod.deployments.forward import forward_predict
from deeppod.errors import DeepPodError

log = logging.getLogger(__name__)


class _Template:
    path = "/v1/deployments/{name}/predict"  # what the latency middleware labels it with


class PredictPath:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not PREDICT_PATH.match(scope["path"]):
            return await self.app(scope, receive, send)
        scope["route"] = _Template
        request = Request(scope, receive)
        try:
            name = scope["path"].split("/")[3]
            dep_id = await authorize(request, name)
            ctx = get_ctx(request)
            response = await forward_predict(request, ctx.balancer, dep_id, ctx.settings.predict_max_bytes)
        except DeepPodError as exc:
            if exc.status >= 500:
                log.error("%s: %s", exc.code, exc.message)
            response = error_response(exc.status, exc.code, exc.message)
        await response(scope, receive, send)

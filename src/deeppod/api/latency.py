"""Times every API request for /metrics (method, route template, status)."""

from __future__ import annotations

import time


class Latency:
    def __init__(self, app, record):
        self.app, self.record = app, record

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"  # a template: bounded labels
            self.record(scope["method"], route, status[0], time.perf_counter() - began)

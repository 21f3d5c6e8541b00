"""Request body size limit for the JSON API.

A declared Content-Length over the limit is refused before reading; a chunked body is
read up to the limit first and replayed, so the handler never sees a partial body.
"""

from __future__ import annotations

import json

from deeppod.errors import TooLarge


class BodyLimit:
    def __init__(self, app, max_bytes: int, streamed=None):
        self.app = app
        self.max_bytes = max_bytes
        # routes that stream large bodies (dataset uploads) and enforce their own limits
        self.streamed = streamed or (lambda method, path: False)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.streamed(scope.get("method"), scope.get("path", "")):
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                return await self._reject(send)
            return await self.app(scope, receive, send)
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay(message), send)
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                return await self._reject(send)
            if not message.get("more_body"):
                break
        return await self.app(scope, _replay({"type": "http.request", "body": bytes(body), "more_body": False},
                                             then=receive), send)

    async def _reject(self, send):
        body = json.dumps({"error": {"code": TooLarge.code, "message":
                          f"the request body is larger than {self.max_bytes} bytes; send less "
                          "(the server's limit is DEEPPOD_MAX_BODY_BYTES)"}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _replay(first: dict, then=None):
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return first
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive

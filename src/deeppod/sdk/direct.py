"""Predictions sent to a deployment's replicas directly, with a direct token the control plane
gives (serve/direct.py says what it checks), instead of through its predict endpoint: one
network hop and no control-plane CPU per prediction. Replicas are spread round-robin; a token
is renewed before a quarter of its life is left; a replica that went away, a revoked or
expired token or a replica that cannot reach its control plane gets one fresh token and
replica list, then the platform's endpoint."""

from __future__ import annotations

import itertools
import time

import httpx

from deeppod.errors import from_response

RENEW_AT = 0.25  # of the token's life left


def predict_body(images: list[bytes] | None, tensors: list | None, top_k: int) -> dict:
    """The request's body as httpx takes it: images as multipart uploads; with tensors, JSON
    (images base64-encoded)."""
    if tensors is not None:
        import base64

        return {"json": {"images": [base64.b64encode(b).decode() for b in images or []], "tensors": tensors,
                         "top_k": top_k}}
    return {"files": [("image", (f"image{i}", data, "application/octet-stream")) for i,
                      data in enumerate(images or [])],
            "data": {"top_k": str(top_k)}}


class DirectPredictor:
    def __init__(self, client, name: str, *, ttl: float = 600.0, timeout: float = 60.0):
        self.client, self.name, self.ttl = client, name, ttl
        self._http = httpx.Client(timeout=timeout)
        self._grant: dict | None = None
        self._next = itertools.count()

    def grant(self, *, renew: bool = False) -> dict:
        """The token and replicas in use: ``{"token", "token_id", "expires_at", "replicas"}``."""
        g = self._grant
        if renew or g is None or not g["replicas"] or g["expires_at"] - time.time() < self.ttl * RENEW_AT:
            g = self._grant = self.client.direct_token(self.name, ttl=self.ttl)
        return g

    def predict(self, images: list[bytes] | None = None, *, tensors: list | None = None, top_k: int = 5) -> dict:
        body = predict_body(images, tensors, top_k)
        for attempt in range(2):
            g = self.grant(renew=attempt > 0)
            if not g["replicas"]:
                break
            replica = g["replicas"][next(self._next) % len(g["replicas"])]
            try:
                r = self._http.post(replica["url"] + "/predict", headers={"Authorization": f"Bearer {g['token']}"},
                                    **body)
            except httpx.TransportError:
                continue  # it went away (a rolling update, a restart): fresh replicas
            if r.status_code in (401, 503):
                continue
            if r.status_code >= 400:
                raise from_response(r.status_code, r.json() if r.content else r.text)
            return r.json()
        return self.client.predict(self.name, images, tensors=tensors, top_k=top_k)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> DirectPredictor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

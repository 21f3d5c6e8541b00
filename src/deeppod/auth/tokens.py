"""Token secrets: random, shown once, stored as sha256 (they carry 256 bits of entropy,
so a fast hash is enough and keeps every API call cheap)."""

from __future__ import annotations

import hashlib
import secrets

from deeppod.store import sealed

PREFIX = "dp_"


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def notebook_secret(job_id: int) -> str:
    """The token a notebook's Jupyter server takes (``JUPYTER_TOKEN``) and only the control
    plane's proxy sends it: derived from the server's key, so it is stored nowhere and the
    same on every server of a failover control plane."""
    return sealed.derive(f"notebook:{job_id}").hex()

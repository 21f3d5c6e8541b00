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
    """A notebook's Jupyter token (``JUPYTER_TOKEN``), from the server's key: stored nowhere."""
    return sealed.derive(f"notebook:{job_id}").hex()

"""Secrets at rest: job ``--env`` values are stored sealed (Fernet: AES-128-CBC + HMAC-SHA256).

The key lives in ``HOME/secret.key`` (0600; made on first start) or comes from
``DEEPPOD_SECRET_KEY``; the server configures it once at start. A copy of the database
without the key shows which jobs set which variables (as sealed blobs), not their values.
Until configured (tests that only touch the store), a key made for this process is used.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import JSON
from sqlalchemy.types import TypeDecorator

from deeppod.errors import InvalidRequest

_lock = threading.Lock()
_fernet: Fernet | None = None
_raw: bytes = b""  # the key as configured: what derive() keys its HMAC with


def configure(key: bytes) -> None:
    global _fernet, _raw
    try:
        f = Fernet(key)
    except (ValueError, TypeError):
        raise InvalidRequest("DEEPPOD_SECRET_KEY (or HOME/secret.key) is not a key: 32 url-safe base64-encoded "
                             "bytes, as 'python -c \"from cryptography.fernet import Fernet; "
                             "print(Fernet.generate_key().decode())\"' prints") from None
    with _lock:
        _fernet, _raw = f, bytes(key)


def derive(label: str) -> bytes:
    """A key of ``label``'s own from the server's: the same on servers sharing the key, telling
    nothing of it or of another label's."""
    _current()
    return hmac.new(_raw, b"deeppod-derive:" + label.encode(), hashlib.sha256).digest()


def new_key() -> bytes:
    return Fernet.generate_key()


def _current() -> Fernet:
    global _fernet, _raw
    with _lock:
        if _fernet is None:
            _raw = Fernet.generate_key()
            _fernet = Fernet(_raw)
        return _fernet


class SealedJSON(TypeDecorator):
    """A JSON value stored as ``{"sealed": TOKEN}``; rows written before sealing (a plain JSON
    value) still read back."""

    impl = JSON
    cache_ok = True

    def process_bind_param(self, value, dialect):  # noqa: ANN001
        if value is None:
            return None
        return {"sealed": _current().encrypt(json.dumps(value).encode()).decode()}

    def process_result_value(self, value, dialect):  # noqa: ANN001
        if isinstance(value, dict) and set(value) == {"sealed"}:
            try:
                return json.loads(_current().decrypt(value["sealed"].encode()))
            except InvalidToken:
                raise InvalidRequest("a job's sealed environment does not open with this server's key: start the "
                                     "server with the HOME/secret.key (or DEEPPOD_SECRET_KEY) it was "
                                     "written with") from None
        return value

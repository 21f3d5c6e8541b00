"""The plan's numeric fields, checked one way for tenants and burst types: errors say which
field of which entry to fix."""

from __future__ import annotations

from deeppod.errors import InvalidRequest


def number(where: str, key: str, value, *, kind=int, allow_none: bool = False, positive: bool = False):
    """``value`` as ``kind`` (int: a whole number), at least 0 (``positive``: more than 0);
    None only with ``allow_none``."""
    if value is None:
        if allow_none:
            return None
        raise InvalidRequest(f"{where}: '{key}' is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        what = "whole number" if kind is int else "number"
        raise InvalidRequest(f"{where}: '{key}' must be a {what} (got {value!r})")
    if value < 0:
        raise InvalidRequest(f"{where}: '{key}' must not be negative (at least 0, got {value})")
    if positive and value == 0:
        raise InvalidRequest(f"{where}: '{key}' must be more than 0 (got {value})")
    return kind(value)

"""References to versioned things: ``NAME``, ``NAME@SELECTOR``, ``TENANT/NAME@SELECTOR``.

Datasets (``digits@2``) and models (``digits@3``, ``digits@champion``) are named the same
way; what a selector may be is up to the caller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from deeppod.errors import InvalidRequest

REF_RE = re.compile(r"^(?:(?P<owner>[a-z0-9][a-z0-9._-]*)/)?(?P<name>[^@/]+)(?:@(?P<sel>[^@/]+))?$")


@dataclass(frozen=True)
class Ref:
    owner: str | None  # another tenant's (shared) name; None: the caller's tenant
    name: str
    selector: str | None  # what follows '@'; None: the latest


def parse_ref(ref: str, how: str) -> Ref:
    """Split ``ref``; ``how`` completes "write ..." in the error, e.g. "NAME or NAME@VERSION"."""
    m = REF_RE.match(ref or "")
    if not m:
        raise InvalidRequest(f"{ref!r} is not a valid reference: write {how}")
    return Ref(m.group("owner"), m.group("name"), m.group("sel"))

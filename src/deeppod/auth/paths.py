"""Every server-side path a user names must lie under their tenant's roots.

The answer is the same whether the path exists or not, so it reveals nothing about what
is on the server outside them.
"""

from __future__ import annotations

import os

from deeppod.errors import Forbidden


class TenantRoots:
    def __init__(self, templates: list[str]):
        self.templates = templates

    def of(self, tenant: str) -> list[str]:
        return [os.path.realpath(t.replace("{tenant}", tenant)) for t in self.templates]

    def check(self, what: str, path: str, tenant: str) -> str:
        """``path`` resolved (symbolic links followed), if it lies under one of ``tenant``'s roots."""
        roots = self.of(tenant)
        real = os.path.realpath(path) if os.path.isabs(path) else None
        if real is None or not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
            raise Forbidden(f"{what} must be a folder under your tenant's roots ({', '.join(roots)}); "
                            f"{path!r} is not")
        return real

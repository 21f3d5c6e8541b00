from __future__ import annotations

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict


class EnvOut(Out):
    key: str
    tenant: str
    requirements: list[str]
    python: str | None
    bytes: int
    built_at: float
    last_used: float
    active_jobs: list[int] = Field(description="active jobs that use it: it is not removed while there are any")
    image: str | None = Field(default=None, description="an unpacked container image's name (shared by every tenant)")


class PruneEnvsIn(Strict):
    keep_bytes: int = Field(default=0, ge=0, description="remove least recently used environments until the cache "
                                                         "takes at most this much (0: every one not in use)")


class PruneEnvsOut(Out):
    removed: list[str]

from __future__ import annotations

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict, from_dataclass
from deeppod.envs.service import EnvInfo

EnvOut = from_dataclass(EnvInfo, "EnvOut", Out, exclude=("path",))  # fields: envs/service.EnvInfo


class PruneEnvsIn(Strict):
    keep_bytes: int = Field(default=0, ge=0, description="remove least recently used environments until the cache "
                                                         "takes at most this much (0: every one not in use)")


class PruneEnvsOut(Out):
    removed: list[str]

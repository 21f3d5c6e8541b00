from datetime import datetime

from deeppod.api.schemas.base import Out, Strict


class NodeHealth(Strict):
    healthy: bool
    gpu: int | None = None


class NodeOut(Out):
    name: str
    address: str
    gpus: list[dict]
    cpus: int
    memory_mb: int
    healthy: bool
    last_seen: datetime

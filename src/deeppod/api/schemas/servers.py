from deeppod.api.schemas.base import Out


class ServerOut(Out):
    """One ``deeppod server`` sharing this database (a failover control plane)."""

    id: str
    url: str  # where jobs, clients and the other servers reach it
    host: str
    pid: int
    up_s: float  # seconds since it started
    seen_s_ago: float  # since its last heartbeat (every second while it runs)
    live: bool
    leader: bool  # runs the reconcile loop and the executor
    epoch: int | None = None  # the leader's fencing epoch

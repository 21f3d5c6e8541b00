from deeppod.api.schemas.base import Out


class BurstTypeOut(Out):
    name: str
    gpus: int
    max_nodes: int
    cost_per_hour: float
    tenants: list[str]
    idle_minutes: float
    wait_minutes: float
    start_minutes: float
    cpus: float | None = None
    memory_gb: float | None = None
    gpu_memory_gb: float | None = None
    nodes_up: int = 0
    nodes_asked: int | None = None  # what the leader asks Ray's autoscaler to keep; None: not known here
    reason: str = ""


class BurstChargeOut(Out):
    tenant: str
    node_type: str
    nodes: int
    seconds: float
    cost: float


class BurstBudgetOut(Out):
    tenant: str
    budget: float
    spent: float


class BurstOut(Out):
    types: list[BurstTypeOut]
    charges: list[BurstChargeOut]
    budgets: list[BurstBudgetOut]

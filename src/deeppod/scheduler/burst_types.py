"""Burst node types: the cloud nodes a plan lets some tenants add when the cluster is full
(its ``burst:`` list), as the administrator declares them. Ray's autoscaler provides the
nodes (its cluster config names a worker type with the resource ``resource``); DeepPod
decides how many of each it asks for (scheduler/burst.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from deeppod.errors import InvalidRequest
from deeppod.scheduler.plan_fields import number

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,40}$")
RESOURCE_PREFIX = "deeppod-burst-"  # a Ray node with resource deeppod-burst-NAME is a burst node of type NAME
FIELDS = {"name", "gpus", "cpus", "memory_gb", "gpu_memory_gb", "max_nodes", "cost_per_hour", "tenants",
          "idle_minutes", "wait_minutes", "start_minutes"}


@dataclass(frozen=True)
class BurstType:
    name: str
    gpus: int  # per node
    max_nodes: int
    cost_per_hour: float  # per node, in the plan's currency
    tenants: tuple[str, ...]  # plan nodes whose jobs (their sub-tenants' too) may run on these nodes
    cpus: float = 0.0  # per node; 0: not said (any CPU request is tried)
    memory_mb: int = 0  # per node; 0: not said
    gpu_memory_mb: int = 0  # each GPU's; 0: not said (any GPU memory request fits, as on logical slots)
    idle_minutes: float = 5.0  # an idle node is kept this long for the next job, then let go
    wait_minutes: float = 1.0  # a job waits this long in the queue before it may burst
    start_minutes: float = 10.0  # nodes asked for that have not joined after this long are reported

    @property
    def resource(self) -> str:
        return RESOURCE_PREFIX + self.name

    def to_dict(self) -> dict:
        d: dict = {"name": self.name, "gpus": self.gpus, "max_nodes": self.max_nodes,
                   "cost_per_hour": self.cost_per_hour, "tenants": list(self.tenants),
                   "idle_minutes": self.idle_minutes, "wait_minutes": self.wait_minutes,
                   "start_minutes": self.start_minutes}
        if self.cpus:
            d["cpus"] = self.cpus
        if self.memory_mb:
            d["memory_gb"] = self.memory_mb / 1024
        if self.gpu_memory_mb:
            d["gpu_memory_gb"] = self.gpu_memory_mb / 1024
        return d


def type_of_resources(resources: dict) -> str | None:
    """The burst type a Ray node's resources name, or None for the cluster's own nodes."""
    return next((k[len(RESOURCE_PREFIX):] for k in resources if k.startswith(RESOURCE_PREFIX)), None)


def parse_burst(raw, tenant_names: set[str]) -> tuple[BurstType, ...]:
    """The plan's ``burst`` list. Errors say what to fix."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRequest("'burst' must be a list of node types, each with name, gpus, max_nodes, cost_per_hour "
                             "and tenants (docs/cluster.md, 'Bursting')")
    out, seen = [], set()
    for i, t in enumerate(raw):
        where = f"burst[{i}]"
        if not isinstance(t, dict):
            raise InvalidRequest(f"{where}: each burst type is a mapping with name, gpus, max_nodes, cost_per_hour, "
                                 f"tenants (got {t!r})")
        unknown = set(t) - FIELDS
        if unknown:
            raise InvalidRequest(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; allowed: "
                                 f"{', '.join(sorted(FIELDS))}")
        name = t.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidRequest(f"{where}: name {name!r} is not valid: lowercase letters, digits, '_' or '-', at "
                                 "most 41 characters (it names the Ray resource deeppod-burst-NAME)")
        where = f"burst type {name!r}"
        if name in seen:
            raise InvalidRequest(f"{where} appears twice; names must be unique")
        seen.add(name)
        for key in ("gpus", "max_nodes", "cost_per_hour", "tenants"):
            if t.get(key) is None:
                raise InvalidRequest(f"{where}: '{key}' is required")
        tenants = t["tenants"]
        if not isinstance(tenants, list) or not tenants or not all(isinstance(x, str) for x in tenants):
            raise InvalidRequest(f"{where}: 'tenants' must be a list of the plan's tenants that may burst, e.g. "
                                 f"['vision'] (got {tenants!r})")
        if unknown_tenants := sorted(set(tenants) - tenant_names):
            raise InvalidRequest(f"{where}: tenants {', '.join(unknown_tenants)} are not in the plan's tenants; "
                                 "add them to 'tenants' first")
        minutes = {k: number(where, k, t[k], kind=float)
                   for k in ("idle_minutes", "wait_minutes", "start_minutes") if k in t}
        out.append(BurstType(
            name=name, gpus=number(where, "gpus", t["gpus"], positive=True),
            max_nodes=number(where, "max_nodes", t["max_nodes"], positive=True),
            cost_per_hour=number(where, "cost_per_hour", t["cost_per_hour"], kind=float), tenants=tuple(tenants),
            cpus=number(where, "cpus", t.get("cpus", 0), kind=float),
            memory_mb=int(number(where, "memory_gb", t.get("memory_gb", 0), kind=float) * 1024),
            gpu_memory_mb=int(number(where, "gpu_memory_gb", t.get("gpu_memory_gb", 0), kind=float) * 1024), **minutes))
    return tuple(out)

"""Resource plans: a tree of tenants with guaranteed GPUs, a borrowing cap (max), a lend
limit and a weight for sharing the surplus; and the entitlements they imply.

Semantics (Kueue's nominalQuota / borrowingLimit / lendingLimit and YuniKorn's
guaranteed / max, on a tree):

- ``guaranteed``: GPUs the node always gets back when it has demand.
- ``max``: the most it may use, its own and borrowed together (``None``: no cap).
- ``lend_limit``: the most of its idle guarantee others may borrow (``None``: all of it).
- ``weight``: its share of what is left after guarantees, among nodes that want more (its
  entitlement): how the surplus is split with ``surplus: share``; with either order it
  bounds the size an elastic job starts at, fair-share shrinks and least-attained
  preemption across tenants.

The plan's ``surplus`` says who gets GPUs beyond the guarantees when several tenants wait
for them: ``service`` (the default), the waiting job with the least attained service, then
the earliest, whoever's it is (Tiresias across tenants: the best average completion time);
``share``, the tenant using least of its weighted share.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

from deeppod.errors import InvalidRequest
from deeppod.scheduler.burst_types import BurstType, parse_burst
from deeppod.scheduler.plan_fields import number

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
# the most a member's job may ask for each worker (each GPU for gpu_memory_gb): a cap, not a share
LIMIT_FIELDS = ("memory_gb_per_worker", "cpus_per_worker", "gpu_memory_gb")
# where its jobs go on a Slurm cluster (deeppod server --executor slurm): sbatch's --account and --qos
SLURM_FIELDS = ("slurm_account", "slurm_qos")
_FIELDS = {"name", "guaranteed", "max", "lend_limit", "weight", "children", "pids_per_worker", "storage_gb",
           "package_indexes", "burst_budget", "notebook_idle_hours", *LIMIT_FIELDS, *SLURM_FIELDS}
_SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_INDEX = re.compile(r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
MIN_PIDS = 16  # a worker's Python, its threads and a shell
SURPLUS_ORDERS = ("service", "share")


@dataclass(frozen=True)
class PlanNode:
    name: str
    guaranteed: int = 0
    max: int | None = None
    lend_limit: int | None = None
    weight: float = 1.0
    children: tuple[PlanNode, ...] = field(default_factory=tuple)
    # the kernel's limits on its jobs (sandbox isolation, docs/security.md): processes and threads
    # per worker (a job may ask for fewer, not more), and the disk its job folders may take, its
    # sub-tenants' included (GB; measured, docs/security.md)
    pids_per_worker: int | None = None
    storage_gb: float | None = None
    # package indexes its jobs' requirements may name (--index-url / --extra-index-url lines),
    # its sub-tenants' too; none: only the server's (DEEPPOD_ENV_INDEX_URL)
    package_indexes: tuple[str, ...] = ()
    # the most its jobs (its sub-tenants' too) may spend on burst nodes, in the burst types'
    # currency; None: no cap of its own
    burst_budget: float | None = None
    # caps on what one of its jobs may ask (LIMIT_FIELDS; its sub-tenants' jobs too): memory and
    # CPUs per worker, memory of each GPU; None: the nodes' size bounds it
    memory_gb_per_worker: float | None = None
    cpus_per_worker: float | None = None
    gpu_memory_gb: float | None = None
    # its jobs' Slurm account and QOS (SLURM_FIELDS; its sub-tenants' too, unless they name their own)
    slurm_account: str | None = None
    slurm_qos: str | None = None
    # its notebooks (its sub-tenants' too) are stopped after this long without kernel activity:
    # the default, and the most one may ask (notebooks/service.py); None: the server's
    notebook_idle_hours: float | None = None

    def to_dict(self) -> dict:
        d: dict = {"name": self.name, "guaranteed": self.guaranteed, "max": self.max,
                   "lend_limit": self.lend_limit, "weight": self.weight}
        if self.pids_per_worker is not None:
            d["pids_per_worker"] = self.pids_per_worker
        if self.storage_gb is not None:
            d["storage_gb"] = self.storage_gb
        if self.package_indexes:
            d["package_indexes"] = list(self.package_indexes)
        if self.burst_budget is not None:
            d["burst_budget"] = self.burst_budget
        for key in (*LIMIT_FIELDS, *SLURM_FIELDS, "notebook_idle_hours"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.children:
            d["children"] = [c.to_dict() for c in self.children]
        return d


@dataclass(frozen=True)
class Plan:
    tenants: tuple[PlanNode, ...] = ()
    reclaim_idle_first: bool = False  # jobs idle on their GPUs (monitor/) are the first to give them back
    surplus: str = "service"  # who gets GPUs beyond the guarantees: SURPLUS_ORDERS
    burst: tuple[BurstType, ...] = ()  # cloud nodes some tenants may add (burst_types.py, burst.py)

    def to_dict(self) -> dict:
        d: dict = {"tenants": [t.to_dict() for t in self.tenants]}
        if self.burst:
            d["burst"] = [b.to_dict() for b in self.burst]
        if self.reclaim_idle_first:
            d["reclaim_idle_first"] = True
        if self.surplus != "service":
            d["surplus"] = self.surplus
        return d

    def walk(self):
        """(node, parent name or None, depth) for every node, parents first."""
        stack = [(n, None, 0) for n in reversed(self.tenants)]
        while stack:
            node, parent, depth = stack.pop()
            yield node, parent, depth
            stack.extend((c, node.name, depth + 1) for c in reversed(node.children))

    def leaves(self) -> list[str]:
        return [n.name for n, _, _ in self.walk() if not n.children]

    def guaranteed_total(self) -> int:
        return sum(t.guaranteed for t in self.tenants)

    def path_to(self, tenant: str) -> list[PlanNode]:
        """The nodes from the top of the plan down to ``tenant``'s ([] if the plan does not name it)."""
        def down(nodes, above):
            for n in nodes:
                if n.name == tenant:
                    return [*above, n]
                if found := down(n.children, [*above, n]):
                    return found
            return []
        return down(self.tenants, [])

    def pids_cap(self, tenant: str) -> int | None:
        """The most processes per worker ``tenant``'s jobs may have: the tightest on its path."""
        return self.cap(tenant, "pids_per_worker")

    def cap(self, tenant: str, key: str):
        """The tightest of ``key`` (pids_per_worker or one of LIMIT_FIELDS) on ``tenant``'s path; None: no cap."""
        caps = [getattr(n, key) for n in self.path_to(tenant) if getattr(n, key) is not None]
        return min(caps) if caps else None

    def nearest(self, tenant: str, key: str):
        """``key`` of ``tenant``'s node, else of the nearest node above it that has one; None: none has."""
        return next((getattr(n, key) for n in reversed(self.path_to(tenant)) if getattr(n, key) is not None), None)

    def package_indexes(self, tenant: str) -> set[str]:
        """The package indexes a tenant's requirements may name: what its node or one above allows."""
        return {url for n in self.path_to(tenant) for url in n.package_indexes}

    def burst_types_for(self, tenant: str) -> list[BurstType]:
        """The burst types whose nodes ``tenant``'s jobs may run on: those naming it or a node above it."""
        path = {n.name for n in self.path_to(tenant)}
        return [b for b in self.burst if path & set(b.tenants)]

    def burst_budgets(self, tenant: str) -> list[tuple[str, float, list[str]]]:
        """(plan node, budget, the tenants whose burst spending counts against it) for every
        node on ``tenant``'s path that has a burst budget."""
        return [(n.name, n.burst_budget, [m.name for m, _, _ in Plan((n,)).walk()])
                for n in self.path_to(tenant) if n.burst_budget is not None]

    def storage_quotas(self) -> list[tuple[str, float, list[str]]]:
        """(node, GB, the tenants whose job folders count against it) for every node with a quota."""
        out = []
        for node, _, _ in self.walk():
            if node.storage_gb is not None:
                below = [n.name for n, _, _ in Plan((node,)).walk()]
                out.append((node.name, node.storage_gb, below))
        return out


def _node(raw, path: str, seen: set[str]) -> PlanNode:
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{path}: each tenant must be a mapping with name, guaranteed, max, ... (got {raw!r})")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise InvalidRequest(f"{path}: unknown field(s) {', '.join(sorted(unknown))}; "
                             f"allowed: {', '.join(sorted(_FIELDS))}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequest(f"{path}: name {name!r} is not valid: use lowercase letters, digits, '.', '_' or '-'")
    where = f"tenant {name!r}"
    if name in seen:
        raise InvalidRequest(f"{where} appears twice in the plan; names must be unique")
    seen.add(name)
    g = number(where, "guaranteed", raw.get("guaranteed", 0), allow_none=False)
    mx = number(where, "max", raw.get("max"), allow_none=True)
    lend = number(where, "lend_limit", raw.get("lend_limit"), allow_none=True)
    weight = number(where, "weight", raw.get("weight", 1.0), allow_none=False, kind=float)
    if weight <= 0:
        raise InvalidRequest(f"{where}: weight must be more than 0 (got {weight})")
    if mx is not None and mx < g:
        raise InvalidRequest(f"{where}: max ({mx}) is below guaranteed ({g}); raise max or lower guaranteed")
    if lend is not None and lend > g:
        raise InvalidRequest(f"{where}: lend_limit ({lend}) is more than guaranteed ({g}); it can only lend its own")
    children_raw = raw.get("children") or []
    if not isinstance(children_raw, list):
        raise InvalidRequest(f"{where}: children must be a list")
    pids = number(where, "pids_per_worker", raw.get("pids_per_worker"), allow_none=True)
    if pids is not None and pids < MIN_PIDS:
        raise InvalidRequest(f"{where}: pids_per_worker must be at least {MIN_PIDS} (got {pids}): a worker's Python "
                             "and its threads need that many")
    storage = number(where, "storage_gb", raw.get("storage_gb"), allow_none=True, kind=float)
    indexes = raw.get("package_indexes") or []
    if not isinstance(indexes, list) or not all(isinstance(u, str) and _INDEX.match(u) for u in indexes):
        raise InvalidRequest(f"{where}: package_indexes must be a list of http(s) URLs of package indexes, e.g. "
                             f"['https://pypi.example.com/simple'] (got {indexes!r})")
    budget = number(where, "burst_budget", raw.get("burst_budget"), allow_none=True, kind=float)
    limits = {key: number(where, key, raw.get(key), allow_none=True, kind=float, positive=True) for key in LIMIT_FIELDS}
    for key in SLURM_FIELDS:
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not _SLURM_NAME.match(value)):
            what = "an account" if key == "slurm_account" else "a QOS"
            raise InvalidRequest(f"{where}: {key} must be the name of {what} of the Slurm cluster (letters, digits, "
                                 f"'.', '_' or '-'; got {value!r})")
        limits[key] = value
    limits["notebook_idle_hours"] = number(where, "notebook_idle_hours", raw.get("notebook_idle_hours"),
                                           allow_none=True, kind=float, positive=True)
    children = tuple(_node(c, f"{path}.children[{i}]", seen) for i, c in enumerate(children_raw))
    if children and sum(c.guaranteed for c in children) > g:
        raise InvalidRequest(f"{where}: its children are guaranteed {sum(c.guaranteed for c in children)} GPUs "
                             f"but it is guaranteed only {g}; raise its guarantee or lower theirs")
    if mx is not None:
        for c in children:
            if c.guaranteed > mx:
                raise InvalidRequest(f"tenant {c.name!r}: guaranteed ({c.guaranteed}) is more than its parent's max "
                                     f"({mx})")
    return PlanNode(name, g, mx, lend, weight, children, pids, storage, tuple(u.rstrip("/") for u in indexes),
                    budget, **limits)


def parse_plan(raw, cluster_gpus: int | None = None) -> Plan:
    """Validate a plan document (from YAML or JSON). Errors say what to fix."""
    if raw is None:
        raw = {"tenants": []}
    if not isinstance(raw, dict) or set(raw) - {"tenants", "reclaim_idle_first", "surplus", "burst"}:
        raise InvalidRequest("a plan is a mapping with 'tenants': a list of tenants (name, guaranteed, max, "
                             "lend_limit, weight, pids_per_worker, storage_gb, package_indexes, burst_budget, "
                             "memory_gb_per_worker, cpus_per_worker, gpu_memory_gb, slurm_account, slurm_qos, "
                             "notebook_idle_hours, children), and optionally 'reclaim_idle_first': true, 'surplus': "
                             "service or share, and 'burst': a list of burst node types")
    idle_first = False if raw.get("reclaim_idle_first") is None else raw["reclaim_idle_first"]
    if not isinstance(idle_first, bool):
        raise InvalidRequest(f"'reclaim_idle_first' must be true or false (got {idle_first!r})")
    surplus = "service" if raw.get("surplus") is None else raw["surplus"]
    if surplus not in SURPLUS_ORDERS:
        raise InvalidRequest(f"'surplus' must be 'service' (GPUs beyond the guarantees go to the job with the least "
                             f"attained service) or 'share' (to the tenant using least of its weighted share); "
                             f"got {surplus!r}")
    tenants_raw = raw.get("tenants") or []
    if not isinstance(tenants_raw, list):
        raise InvalidRequest("'tenants' must be a list")
    seen: set[str] = set()
    tenants = tuple(_node(t, f"tenants[{i}]", seen) for i, t in enumerate(tenants_raw))
    plan = Plan(tenants, idle_first, surplus, parse_burst(raw.get("burst"), seen))
    if cluster_gpus is not None and plan.guaranteed_total() > cluster_gpus:
        raise InvalidRequest(f"the plan guarantees {plan.guaranteed_total()} GPUs but the cluster has {cluster_gpus}; "
                             "lower the guarantees so that they add up to at most the cluster")
    return plan


# -- entitlements ----------------------------------------------------------------

@dataclass
class _Flat:
    name: str
    guaranteed: float
    max: float
    lend_limit: float | None
    weight: float
    children: list[str]


def _water_fill(amount: float, want: dict[str, float], weight: dict[str, float]) -> dict[str, float]:
    """Weighted max-min: share ``amount`` by weight, nobody above what it wants.

    In steps: all who still want more get the same step times their weight, until the next
    one has what it wants or the amount runs out. Those of one weight gain the same sums in
    the same order, so one running total stands for all of them and a heap of their wants
    says who is full next: a step costs the number of distinct weights, not of tenants (a
    round with 200 tenants took most of its time here, a step per tenant over every tenant).
    """
    got = {k: 0.0 for k in want}
    level: dict[float, float] = {}  # weight -> what each of that weight who still wants more has got
    left: dict[float, list[tuple[float, str]]] = defaultdict(list)  # weight -> heap of (want, name)
    for k, w in want.items():
        if w > 1e-9:
            left[weight[k]].append((w, k))
    for w, heap in left.items():
        heapq.heapify(heap)
        level[w] = 0.0
    while amount > 1e-9 and left:
        total_w = sum(w * len(heap) for w, heap in left.items())
        step = min((heap[0][0] - level[w]) / w for w, heap in left.items())
        give = min(step, amount / total_w)
        for w in list(left):
            level[w] += give * w
            heap = left[w]
            while heap and heap[0][0] - level[w] <= 1e-9:
                got[heapq.heappop(heap)[1]] = level[w]
            if not heap:
                del left[w]
        amount -= give * total_w
    for w, heap in left.items():
        for _, k in heap:
            got[k] = level[w]
    return got


def flat_plan(plan: Plan) -> tuple[dict[str, _Flat], list[str]]:
    """The plan's nodes by name, and the top level's names: what ``entitlements`` reads of it."""
    nodes: dict[str, _Flat] = {}
    for node, _parent, _ in plan.walk():
        nodes[node.name] = _Flat(node.name, node.guaranteed, math.inf if node.max is None else node.max,
                                 node.lend_limit, node.weight, [c.name for c in node.children])
    return nodes, [t.name for t in plan.tenants]


def entitlements(plan: Plan, demand: dict[str, float], capacity: float,
                 flat: tuple[dict[str, _Flat], list[str]] | None = None) -> dict[str, float]:
    """GPUs each plan node (and each unplanned leaf tenant in ``demand``) should have now.

    At every level: each child first gets its guarantee up to its demand; idle guarantee
    up to the lend limit, plus what no one is guaranteed, is shared by weight among the
    children that want more, never beyond their ``max``. Tenants with demand that the
    plan does not name sit at the top level with no guarantee and weight 1. ``flat``:
    ``flat_plan(plan)``, if the caller kept it (it is not changed).
    """
    nodes, top = flat or flat_plan(plan)
    nodes, top = dict(nodes), list(top)
    for tenant in demand:
        if tenant not in nodes:
            nodes[tenant] = _Flat(tenant, 0, math.inf, None, 1.0, [])
            top.append(tenant)

    want: dict[str, float] = {}

    def subtree_demand(name: str) -> float:
        n = nodes[name]
        d = sum(subtree_demand(c) for c in n.children) if n.children else demand.get(name, 0.0)
        want[name] = min(d, n.max)
        return want[name]

    for name in top:
        subtree_demand(name)
    out: dict[str, float] = {}

    def share(children: list[str], amount: float) -> None:
        base = {c: min(nodes[c].guaranteed, want[c]) for c in children}
        idle = {c: nodes[c].guaranteed - base[c] for c in children}
        lendable = sum(idle[c] if nodes[c].lend_limit is None else min(idle[c], nodes[c].lend_limit)
                       for c in children)
        unguaranteed = max(0.0, amount - sum(nodes[c].guaranteed for c in children))
        surplus = min(unguaranteed + lendable, max(0.0, amount - sum(base.values())))
        extra = _water_fill(surplus, {c: want[c] - base[c] for c in children}, {c: nodes[c].weight for c in children})
        for c in children:
            out[c] = base[c] + extra[c]
            if nodes[c].children:
                share(nodes[c].children, out[c])

    share(top, capacity)
    return out

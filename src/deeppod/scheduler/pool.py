"""Free GPU slots by node, with fast gang placement.

Nodes are bucketed by their number of free GPUs so that placing a job is a walk over at
most ``gpus_per_node`` buckets, not over every node: a round with 10,000 queued jobs on
128 nodes stays within milliseconds.
"""

from __future__ import annotations

from deeppod.scheduler.snapshot import NodeState, WorkerPlacement
from deeppod.scheduler.topology import NV, describe, tightest

TOPOLOGY_CANDIDATES = 16  # equally full nodes compared for the tightest set (a round stays in milliseconds)


class FreePool:
    def __init__(self, nodes: tuple[NodeState, ...]):
        self.names = [n.name for n in nodes]
        self.index = {n.name: i for i, n in enumerate(nodes)}
        self.free = [sorted(n.free_gpus) if n.healthy else [] for n in nodes]
        self.cpus = [n.free_cpus if n.healthy else 0.0 for n in nodes]
        self.mem = [n.free_memory_mb if n.healthy else 0 for n in nodes]
        self.topo = [n.topology for n in nodes]
        self.gmem = [n.gpu_memory_mb for n in nodes]
        self._fill()

    @classmethod
    def of_parts(cls, names: list[str], index: dict[str, int], free: list[list[int]], cpus: list[float],
                 mem: list[int], buckets: list[set[int]], total_free: int, topo: list | None = None,
                 gmem: list[int] | None = None) -> FreePool:
        """The pool ``FreePool(nodes)`` builds, from parts kept from one round to the next
        (round_cache.py): ``buckets`` as ``fresh_bucket`` builds each. Shared, not copied: the
        names, the index, each node's free list (a change replaces it, never edits it) and each
        bucket until this pool first changes it (then it takes a fresh copy of its own)."""
        pool = cls.__new__(cls)
        pool.names, pool.index = names, index
        pool.free, pool.cpus, pool.mem = list(free), list(cpus), list(mem)
        pool.topo = topo if topo is not None else [None] * len(names)
        pool.gmem = gmem if gmem is not None else [0] * len(names)
        pool.buckets, pool._shared = list(buckets), set(range(len(buckets)))
        pool.width, pool.total_free = len(buckets) - 1, total_free
        pool._fit_free = {}
        return pool

    def _fill(self) -> None:
        """The buckets, filled in node order: ``place`` takes the first node of a bucket in
        the set's order, so the same pool must always be built the same way (``fresh_bucket``)."""
        self.width = max(map(len, self.free), default=0)
        buckets = self.buckets = [set() for _ in range(max(self.width, 64) + 1)]
        for i, f in enumerate(self.free):  # every length is within the buckets: no _bucket() needed
            buckets[len(f)].add(i)
        self.total_free = sum(map(len, self.free))
        self._shared: set[int] | None = None
        self._fit_free: dict[int, int] = {}  # GPU MiB asked -> free GPUs that have it (free_with), kept as they change

    def _bucket(self, i: int) -> set[int]:
        n = len(self.free[i])
        while n >= len(self.buckets):
            self.buckets.append(set())
        if self._shared and n in self._shared:
            self._shared.discard(n)
            self.buckets[n] = fresh_bucket(self.buckets[n])
        return self.buckets[n]

    # -- changes -------------------------------------------------------------------
    def take(self, node: int, gpus: list[int] | tuple[int, ...], cpus: float, mem: int) -> None:
        self._bucket(node).discard(node)
        taken = set(gpus)
        self.free[node] = [g for g in self.free[node] if g not in taken]
        self.cpus[node] -= cpus
        self.mem[node] -= mem
        self._bucket(node).add(node)
        self.total_free -= len(taken)
        if self._fit_free:
            self._count_fit(node, -len(taken))

    def give(self, node: str, gpus: tuple[int, ...], cpus: float, mem: int) -> None:
        i = self.index.get(node)
        if i is None:
            return
        self._bucket(i).discard(i)
        self.free[i] = sorted(set(self.free[i]) | set(gpus))
        self.cpus[i] += cpus
        self.mem[i] += mem
        self._bucket(i).add(i)
        self.total_free += len(gpus)
        if self._fit_free:
            self._count_fit(i, len(gpus))

    def release(self, placement: tuple[WorkerPlacement, ...]) -> None:
        for w in placement:
            self.give(w.node, w.gpus, w.cpus, w.memory_mb)

    def copy(self) -> FreePool:
        other = FreePool.__new__(FreePool)
        other.names, other.index, other.width = self.names, self.index, self.width
        other.free = [list(f) for f in self.free]
        other.cpus = list(self.cpus)
        other.mem = list(self.mem)
        other.topo, other.gmem = self.topo, self.gmem
        other.buckets = [set(b) for b in self.buckets]
        other._shared = None
        other.total_free = self.total_free
        other._fit_free = dict(self._fit_free)
        return other

    # -- placement -----------------------------------------------------------------
    def gpus_fit(self, i: int, gmem: int) -> bool:
        """Node ``i``'s GPUs have ``gmem`` MiB each (an unknown size, logical slots, fits any)."""
        return not gmem or not self.gmem[i] or self.gmem[i] >= gmem

    def free_with(self, gmem: int) -> int:
        """The free GPUs that have ``gmem`` MiB each (``gpus_fit``): counted once, then kept as
        GPUs are taken and given (a round asks for it per waiting job that asks GPU memory)."""
        if not gmem:
            return self.total_free
        got = self._fit_free.get(gmem)
        if got is None:
            got = self._fit_free[gmem] = sum(len(f) for i, f in enumerate(self.free) if self.gpus_fit(i, gmem))
        return got

    def _count_fit(self, i: int, delta: int) -> None:
        for gmem in self._fit_free:
            if self.gpus_fit(i, gmem):
                self._fit_free[gmem] += delta

    def _room(self, i: int, gpw: int, cpw: float, mpw: int, gmem: int = 0) -> int:
        if gmem and gpw and 0 < self.gmem[i] < gmem:  # not gpus_fit(): inline in the placement walk
            return 0
        room = len(self.free[i]) // gpw if gpw else 1 << 30
        if cpw:
            room = min(room, int(self.cpus[i] / cpw + 1e-9))
        if mpw:
            room = min(room, self.mem[i] // mpw)
        return room

    def shortage(self, workers: int, gpw: int, cpw: float = 0.0, mpw: int = 0, gmem: int = 0) -> str:
        """Why ``place`` found no room for this gang: which resource is short (for wait reasons)."""
        def fits(c: float, m: int, g: int = 0) -> bool:
            return self.copy().place(workers, gpw, c, m, gmem=g) is not None

        if gmem and gpw and fits(cpw, mpw) and not fits(cpw, mpw, gmem):
            return (f"no set of nodes has {workers} x {gpw} free GPUs with {gmem} MiB each at once "
                    f"({self.free_with(gmem)} of the {self.total_free} free GPUs have that much memory; lower "
                    "--gpu-memory, or wait for running jobs)")

        free_cpus = sum(max(0.0, c) for c in self.cpus)
        free_mem = sum(max(0, m) for m in self.mem)
        cpus = (f"not enough free CPUs: {workers} workers x {cpw:g} CPUs, {free_cpus:g} CPUs free "
                "(lower --cpus-per-worker, or wait for running jobs)")
        mem = (f"not enough free memory: {workers} workers x {mpw} MiB, {free_mem} MiB free "
               "(lower --memory, or wait for running jobs)")
        if gpw and workers * gpw <= self.total_free and fits(0.0, 0):
            pass  # the GPUs are there together: CPU or memory is what is short
        elif gpw:
            return (f"no set of nodes has {workers} x {gpw} free GPUs at once ({self.total_free} free, spread "
                    "over nodes or held back)")
        if fits(0.0, mpw):
            return cpus
        if fits(cpw, 0):
            return mem
        return f"{cpus}; {mem}"

    def _tightest_node(self, first: int, others, need: int) -> int:
        """Of the equally full nodes that fit, the one whose free GPUs hold the tightest set of
        ``need`` (topology.py); the first when nodes say nothing of their links. At most
        ``TOPOLOGY_CANDIDATES`` are looked at, and a set over NVLink ends the search."""
        if self.topo[first] is None:
            return first
        best, best_span = first, self.topo[first].span(tightest(self.free[first], need, self.topo[first]))
        for n, i in enumerate(others):
            if best_span <= NV or n >= TOPOLOGY_CANDIDATES:
                break
            if self.topo[i] is not None:
                span = self.topo[i].span(tightest(self.free[i], need, self.topo[i]))
                if span < best_span:
                    best, best_span = i, span
        return best

    def links_note(self, placement: tuple[WorkerPlacement, ...]) -> str:
        """How the placed workers' GPUs are linked, for the job's start event ("; GPUs 4,5,6
        over NVLink"); empty where the nodes say nothing of their links."""
        notes = []
        for w in placement:
            i = self.index.get(w.node)
            said = describe(self.topo[i], w.gpus) if i is not None else ""
            if said:
                notes.append(f"{said} on {w.node}" if len({p.node for p in placement}) > 1 else said)
        return "; " + ", ".join(notes) if notes else ""

    def fits(self, workers: int, gpw: int) -> bool:
        return workers * gpw <= self.total_free

    def place(self, workers: int, gpw: int, cpw: float = 0.0, mpw: int = 0,
              avoid: frozenset[tuple[str, int]] = frozenset(), gmem: int = 0) -> tuple[WorkerPlacement, ...] | None:
        """Place ``workers`` workers at once (a gang) or return None; takes the slots.

        One node if any can hold the whole job (the fullest such node, to keep empty nodes
        for large jobs); otherwise the emptiest nodes first so it spans as few as possible.
        Ranks are ordered node by node. ``avoid`` slots are used only if nothing else fits.
        ``gmem``: only nodes whose GPUs have that much memory each (``gpus_fit``).
        """
        if avoid:
            hidden = [(self.index[n], g) for n, g in avoid if n in self.index and g in self.free[self.index[n]]]
            for i, g in hidden:
                self.take(i, [g], 0, 0)
            got = self.place(workers, gpw, cpw, mpw, gmem=gmem)
            for i, g in hidden:
                self.give(self.names[i], (g,), 0, 0)
            if got is not None:
                return got
        if workers * gpw > self.total_free:
            return None
        chosen: list[tuple[int, int]] = []  # (node, workers there)
        if gpw == 0:
            rooms = [(self._room(i, 0, cpw, mpw), i) for i in range(len(self.names))]
            single = [(r, i) for r, i in rooms if r >= workers]
            if single:
                chosen = [(min(single)[1], workers)]
            else:
                left = workers
                for r, i in sorted(rooms, key=lambda x: (-x[0], x[1])):
                    if left == 0 or r == 0:
                        break
                    chosen.append((i, min(r, left)))
                    left -= min(r, left)
                if left:
                    return None
        else:
            need = workers * gpw
            for k in range(need, len(self.buckets)):
                fits = (i for i in self.buckets[k] if self._room(i, gpw, cpw, mpw, gmem) >= workers)
                first = next(fits, None)
                if first is not None:
                    chosen = [(self._tightest_node(first, fits, need) if need > 1 else first, workers)]
                    break
            if not chosen:
                left = workers
                for k in range(len(self.buckets) - 1, gpw - 1, -1):
                    for i in sorted(self.buckets[k]):
                        r = min(self._room(i, gpw, cpw, mpw, gmem), left)
                        if r > 0:
                            chosen.append((i, r))
                            left -= r
                            if left == 0:
                                break
                    if left == 0:
                        break
                if left:
                    return None
        placement: list[WorkerPlacement] = []
        for i, count in chosen:
            for _ in range(count):  # each worker its tightest set of the node's free GPUs (topology.py)
                gpus = tightest(self.free[i], gpw, self.topo[i])
                self.take(i, gpus, cpw, mpw)
                placement.append(WorkerPlacement(len(placement), self.names[i], gpus, cpw, mpw))
        return tuple(placement)


def fresh_bucket(nodes) -> set[int]:
    """A bucket built in index order as ``_fill`` does: ``place`` takes a set's first node."""
    return set(sorted(nodes))

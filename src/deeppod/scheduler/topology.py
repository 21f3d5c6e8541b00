"""How a node's GPUs talk to each other, and the tightest set of free ones for a worker.

The levels are ``nvidia-smi topo -m``'s, fastest first: NV (NVLink or NVSwitch), PIX (one
PCIe switch), PXB (several switches), PHB (one host bridge), NODE (one NUMA node) and SYS
(across sockets). A set of GPUs is as tight as its slowest pair. Placing a worker of k GPUs
on a node takes the free set whose slowest pair is fastest, then whose pairs are fastest in
sum, then that leaves the node's remaining free GPUs the tightest (fewest tight sets broken),
then the lowest indices (so the same inputs give the same answer). Pure: no probe here; the
node's inventory fills ``NodeState.topology`` (and tests use :func:`dgx1`, :func:`nvswitch8`
and :func:`pcie_box`, the fake topologies of real machines).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import comb

NV, PIX, PXB, PHB, NODE, SYS = 1, 2, 3, 4, 5, 6
NAMES = {NV: "NVLink", PIX: "one PCIe switch", PXB: "PCIe switches", PHB: "one host bridge", NODE: "one NUMA node",
         SYS: "across sockets"}
_CODES = {"NV": NV, "PIX": PIX, "PXB": PXB, "PHB": PHB, "NODE": NODE, "SYS": SYS}
EXHAUSTIVE_UP_TO = 5000  # candidate sets tried one by one; past that, grown greedily


@dataclass(frozen=True)
class Topology:
    """``links[i][j]``: the level between GPUs i and j (0 on the diagonal)."""

    links: tuple[tuple[int, ...], ...]

    @classmethod
    def parse(cls, rows: list[list[str]]) -> Topology:
        """From ``nvidia-smi topo -m``'s GPU columns: "X" on the diagonal, "NV4", "PIX", "SYS"..."""
        def level(cell: str) -> int:
            cell = cell.strip().upper()
            if cell == "X":
                return 0
            if cell.startswith("NV"):
                return NV
            if cell not in _CODES:
                raise ValueError(f"unknown link {cell!r}: expected X, NV#, PIX, PXB, PHB, NODE or SYS")
            return _CODES[cell]

        links = tuple(tuple(level(c) for c in row) for row in rows)
        if any(len(r) != len(links) for r in links):
            raise ValueError("the topology matrix is not square")
        return cls(links)

    def span(self, gpus) -> int:
        """The slowest link within ``gpus`` (0 for one GPU)."""
        gpus = list(gpus)
        return max((self.links[a][b] for a, b in combinations(gpus, 2)), default=0)

    def cost(self, gpus) -> tuple[int, int]:
        return self.span(gpus), sum(self.links[a][b] for a, b in combinations(gpus, 2))


def tightest(free: list[int], k: int, topo: Topology | None) -> tuple[int, ...]:
    """The ``k`` of ``free`` (sorted) a worker should take; the first k without a topology."""
    if topo is None or k <= 1 or k >= len(free):
        return tuple(free[:k])
    known = [g for g in free if g < len(topo.links)]
    if len(known) < k:
        return tuple(free[:k])
    if comb(len(known), k) > EXHAUSTIVE_UP_TO:
        return _greedy(known, k, topo)

    def key(c):
        rest = [g for g in known if g not in c]
        return (*topo.cost(c), _leftover(rest, k, topo), c)

    return min(combinations(known, k), key=key)


def _leftover(rest: list[int], k: int, topo: Topology) -> int:
    """How loose the best set of the same size left behind would be (lower is better)."""
    if len(rest) < k:
        return 0
    return min(topo.span(c) for c in combinations(rest, k)) if comb(len(rest), k) <= 200 else 0


def _greedy(known: list[int], k: int, topo: Topology) -> tuple[int, ...]:
    best = None
    for start in known:
        chosen = [start]
        while len(chosen) < k:
            nxt = min((g for g in known if g not in chosen),
                      key=lambda g: (max(topo.links[g][c] for c in chosen), sum(topo.links[g][c] for c in chosen), g))
            chosen.append(nxt)
        c = tuple(sorted(chosen))
        if best is None or (*topo.cost(c), c) < (*topo.cost(best), best):
            best = c
    return best


def describe(topo: Topology | None, gpus) -> str:
    """Why these GPUs: "GPUs 0,1,2,3 over NVLink" (for the job's events)."""
    gpus = list(gpus)
    if topo is None or len(gpus) < 2:
        return ""
    return f"GPUs {','.join(map(str, gpus))} over {NAMES[topo.span(gpus)]}"


# -- fake topologies of real machines (tests, benchmarks, the simulator) --------------------

def _from(n: int, level) -> Topology:
    return Topology(tuple(tuple(0 if i == j else level(i, j) for j in range(n)) for i in range(n)))


def dgx1() -> Topology:
    """DGX-1 (V100): the hybrid cube-mesh. GPUs 0-3 and 4-7 are fully NVLinked quads (one per
    socket), and i is NVLinked to i+4; every other pair crosses the sockets."""
    def level(i, j):
        if i // 4 == j // 4 or abs(i - j) == 4:
            return NV
        return SYS
    return _from(8, level)


def nvswitch8() -> Topology:
    """An 8-GPU NVSwitch node (DGX A100/H100, HGX): every pair over NVLink."""
    return _from(8, lambda i, j: NV)


def pcie_box() -> Topology:
    """An 8-GPU PCIe server: two sockets, two PCIe switches per socket, two GPUs per switch."""
    def level(i, j):
        if i // 2 == j // 2:
            return PIX
        if i // 4 == j // 4:
            return NODE
        return SYS
    return _from(8, level)

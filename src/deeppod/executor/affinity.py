"""Which cores a worker's threads may run on: those near its GPUs (the NUMA node the kernel
reports for each GPU's PCI device), so the host side of its work (the loader's copies into
pinned memory, kernel launches, NCCL's proxy threads) does not cross the socket to reach
them, as Slurm's GPU binding and ``nvidia-smi topo -m``'s "CPU Affinity" column have it.

A worker is pinned only where that means something and costs it nothing: it has real GPUs,
the cores near them are fewer than this process may use (more than one NUMA node), and they
are at least as many as the CPUs it asked for. Otherwise it keeps the whole machine. Standard
library only: the supervisor uses it before a worker (sandboxed or not) runs a line.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

ROOT = Path("/")  # where /proc and /sys are (tests: a fake tree)
GPUS = "proc/driver/nvidia/gpus"  # one folder per GPU, named by its PCI address, as the driver lists them
PCI = "sys/bus/pci/devices"  # each device's local_cpulist: the cores of its NUMA node


def parse_list(text: str) -> set[int]:
    """The kernel's CPU list format ("0-3,8,10-11") as a set; empty for an empty list."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def format_list(cores: set[int]) -> str:
    """The kernel's CPU list format for a set: {0, 1, 2, 3, 8} -> "0-3,8"."""
    runs: list[list[int]] = []
    for c in sorted(cores):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def gpu_addresses(root: Path) -> list[str]:
    """The node's GPUs' PCI addresses in NVML's index order (by address; the workers' CUDA
    sees the same order: contract.worker_env sets CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    try:
        return sorted(p.name.lower() for p in (root / GPUS).iterdir())
    except OSError:
        return []


def near(gpus: list[int], cpus_wanted: float | None, root: Path | None = None,
         allowed: set[int] | None = None) -> set[int] | None:
    """The cores a worker with ``gpus`` (the node's indices) should be pinned to, or None to
    leave it unpinned (see the module's doc for when)."""
    if not gpus:
        return None
    root = ROOT if root is None else root
    addresses = gpu_addresses(root)
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    cores: set[int] = set()
    for g in gpus:
        if g >= len(addresses):  # logical slots, or a GPU this node does not list
            return None
        try:
            cores |= parse_list((root / PCI / addresses[g] / "local_cpulist").read_text())
        except (OSError, ValueError):
            return None
    cores &= allowed
    if not cores or cores == allowed or len(cores) < math.ceil(cpus_wanted or 1):
        return None
    return cores


def for_worker(env: dict[str, str], root: Path | None = None) -> set[int] | None:
    """:func:`near` for a worker from its environment: the node's GPUs it was given
    (CUDA_VISIBLE_DEVICES, indices) and the threads its CPU request gave it (OMP_NUM_THREADS)."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    if not visible or not all(v.strip().isdigit() for v in visible.split(",")):
        return None  # none, or UUIDs (a user's own setting): nothing to pin to
    return near([int(v) for v in visible.split(",")], float(threads_of(env)), root)


def threads_of(env: dict[str, str]) -> int:
    """The math threads a worker's CPU request gave it (OMP_NUM_THREADS; 1 if unset or not a number)."""
    threads = env.get("OMP_NUM_THREADS", "1")
    return int(threads) if threads.isdigit() else 1


def pin_tree(pid: int, cores: set[int]) -> int:
    """Pin a running process, every thread of it and every process under it (a warm spare
    handed a GPU worker's place, with its loader's fork server): the threads it starts later
    inherit it. How many threads were pinned; 0 if it is gone."""
    pinned, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            tasks = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue  # it exited
        for tid in tasks:
            try:
                os.sched_setaffinity(tid, cores)
                pinned += 1
                todo += [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
            except (OSError, ValueError):
                pass  # a thread that ended meanwhile
    return pinned


def pinning(cores: set[int] | None, then=None):
    """A ``preexec_fn``: pin the new process to ``cores`` (its threads and children inherit
    it), then run ``then``; None when there is nothing to do."""
    if cores is None:
        return then

    def pin() -> None:
        os.sched_setaffinity(0, cores)
        if then is not None:
            then()

    return pin


WAIT_POLICY = "OMP_WAIT_POLICY"


def quiet_threads(workers: list[dict], cores: int | None = None) -> list[int]:
    """Tell the OpenMP threads of a job's workers on this node to sleep when idle instead of
    spinning (``OMP_WAIT_POLICY=PASSIVE``) where they may outnumber the cores this node lets us
    use: the job's own math threads, summed (each worker's OMP_NUM_THREADS), are more (several
    workers on a small node), or the server offers more CPUs on this node than it has (each
    worker's ``node_cpus``), so jobs that each fit may together be more. A spinning thread then
    holds a core that a worker waiting on it in the all-reduce, or another job, needs (3 gloo
    workers of 2 threads on 2 cores: 2.26-3.45x the images/s, benchmarks/crowded_workers.py).
    With no more threads than cores, spinning costs nobody else and saves a wake-up per
    parallel region, so it stays. A worker's own setting is kept, and a worker of one thread has
    no pool to quiet. ``workers``: the spec's, changed in place; the ranks changed."""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    offered = max((w.get("node_cpus") or 0 for w in workers), default=0)
    if sum(threads_of(w["env"]) for w in workers) <= cores and offered <= cores:
        return []
    changed = []
    for w in workers:
        if WAIT_POLICY not in w["env"] and threads_of(w["env"]) > 1:
            w["env"][WAIT_POLICY] = "PASSIVE"
            changed.append(int(w["rank"]))
    return changed

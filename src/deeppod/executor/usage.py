"""What a running job uses on this machine: CPU time and resident memory of its process tree
(the supervisor, its workers, their loader workers), read from /proc through psutil. The
monitor samples it every period (monitor/loop.py), so a job's page can chart it."""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Usage:
    cpu_seconds: float  # user + system since the tree started, the children it reaped included
    memory_mb: float  # resident sets summed (pages shared by forked loader workers count in each)


def of_tree(pid: int) -> Usage | None:
    """The tree under ``pid`` now; None when it is gone. The caller has checked that ``pid`` is
    still the process it started (a pid and its start time), so a reused pid is never read."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    cpu = rss = 0.0
    for p in procs:
        try:
            with p.oneshot():
                t = p.cpu_times()
                mem = p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue  # it ended between the listing and the read: its parent's children_* hold it soon
        cpu += t.user + t.system + t.children_user + t.children_system
        rss += mem
    return Usage(cpu, rss / 2**20)

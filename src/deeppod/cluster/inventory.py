"""The nodes the control plane schedules onto, as plain values."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from deeppod.cluster.gpus import GpuInfo, GpuProbe


@dataclass(frozen=True)
class NodeInfo:
    name: str
    address: str
    cpus: int
    memory_mb: int
    gpus: tuple[GpuInfo, ...] = field(default_factory=tuple)
    healthy: bool = True
    burst: str | None = None  # a burst node's type (its Ray resource deeppod-burst-TYPE); None: the cluster's own
    reason: str = ""  # why it is not healthy, in its cluster's words (Slurm's state and Reason); "": not said


def physical_memory_mb() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError):
        return 0


def local_node(probe: GpuProbe, *, cpus: int | None = None, memory_mb: int | None = None,
               address: str = "127.0.0.1") -> NodeInfo:
    return NodeInfo(
        name=socket.gethostname() or "localhost",
        address=address,
        cpus=cpus if cpus is not None else (os.cpu_count() or 1),
        memory_mb=memory_mb if memory_mb is not None else physical_memory_mb(),
        gpus=tuple(probe.probe()),
    )

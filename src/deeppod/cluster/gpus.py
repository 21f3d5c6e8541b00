"""GPU probes: the inventory of a node's GPUs. NVML when a driver is present (nvml.py); logical
slots so CPU machines schedule too."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from deeppod.cluster.nvml import Nvml

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_mb: int
    logical: bool
    links: tuple[int, ...] = ()  # its link level to each GPU of the node (scheduler/topology.py); (): unknown

    def to_dict(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "name": self.name,
                "memory_mb": self.memory_mb, "logical": self.logical,
                **({"links": list(self.links)} if self.links else {})}


class GpuProbe(Protocol):
    def probe(self) -> list[GpuInfo]: ...


class LogicalProbe:
    """``n`` logical GPU slots: scheduling works exactly as with real GPUs. ``memory_mb``: what
    each stands for (0: not known; a job's GPU memory request is then not checked)."""

    def __init__(self, n: int, memory_mb: int | None = None):
        self.n, self.memory_mb = n, memory_mb or 0

    def probe(self) -> list[GpuInfo]:
        return [GpuInfo(i, f"logical-{i}", "logical GPU slot", self.memory_mb, True) for i in range(self.n)]


class FakeProbe:
    """Returns whatever GPUs a test hands it."""

    def __init__(self, gpus: list[GpuInfo]):
        self.gpus = list(gpus)

    def probe(self) -> list[GpuInfo]:
        return list(self.gpus)


class NvmlProbe:
    """Real GPUs through NVML (nvml.py). Returns [] when no driver is loaded."""

    def probe(self) -> list[GpuInfo]:
        try:
            nvml = Nvml()
        except ImportError:
            return []
        except Exception as exc:  # pynvml.NVMLError: no driver, no device
            log.debug("NVML not available: %s", exc)
            return []
        with nvml:
            links = nvml.links() if len(nvml.handles) > 1 else []
            return [GpuInfo(i, *nvml.identity(i), False, tuple(links[i]) if links else ())
                    for i in range(len(nvml.handles))]


def default_probe(logical_gpus: int | None, logical_memory_mb: int | None = None) -> GpuProbe:
    """``--gpus N`` asks for N logical slots (``--gpu-memory`` each); otherwise the real GPUs, if any."""
    if logical_gpus is not None:
        return LogicalProbe(logical_gpus, logical_memory_mb)
    return NvmlProbe()


def gpu_memory_of(gpus: list[dict]) -> int:
    """The least memory (MiB) among a node's healthy GPUs; 0 (any request fits) where one does not
    say (logical slots)."""
    sizes = [int(g.get("memory_mb") or 0) for g in gpus if g.get("healthy", True)]
    return 0 if not sizes or 0 in sizes else min(sizes)

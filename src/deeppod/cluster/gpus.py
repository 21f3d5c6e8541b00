"""GPU probes. NVML when a driver is present; logical slots so CPU machines schedule too."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_mb: int
    logical: bool

    def to_dict(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "name": self.name,
                "memory_mb": self.memory_mb, "logical": self.logical}


class GpuProbe(Protocol):
    def probe(self) -> list[GpuInfo]: ...


class LogicalProbe:
    """``n`` logical GPU slots: scheduling works exactly as with real GPUs."""

    def __init__(self, n: int):
        self.n = n

    def probe(self) -> list[GpuInfo]:
        return [GpuInfo(i, f"logical-{i}", "logical GPU slot", 0, True) for i in range(self.n)]


class FakeProbe:
    """Returns whatever GPUs a test hands it."""

    def __init__(self, gpus: list[GpuInfo]):
        self.gpus = list(gpus)

    def probe(self) -> list[GpuInfo]:
        return list(self.gpus)


class NvmlProbe:
    """Real GPUs through NVML (nvidia-ml-py). Returns [] when no driver is loaded."""

    def probe(self) -> list[GpuInfo]:
        try:
            import pynvml
        except ImportError:
            return []
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            log.debug("NVML not available: %s", exc)
            return []
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                uuid = pynvml.nvmlDeviceGetUUID(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1 << 20)
                out.append(GpuInfo(i, _s(uuid), _s(name), int(mem), False))
            return out
        finally:
            pynvml.nvmlShutdown()


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def default_probe(logical_gpus: int | None) -> GpuProbe:
    """``--gpus N`` asks for N logical slots; otherwise the real GPUs, if any."""
    if logical_gpus is not None:
        return LogicalProbe(logical_gpus)
    return NvmlProbe()

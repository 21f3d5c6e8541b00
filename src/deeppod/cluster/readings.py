"""What a node's samplers read: per GPU (NVML, or a fake for tests and CPU machines) and per
host (psutil). Each sampler is a small interface with a fake beside it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Protocol

from deeppod.cluster.nvml import Nvml

log = logging.getLogger(__name__)
# Xid errors that mean the GPU (not the program) is broken: NVIDIA's "GPU has fallen off the bus",
# double-bit ECC, page retirement failures, row remapping failures, ...
CRITICAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 123, 140})


@dataclass(frozen=True)
class GpuReading:
    index: int
    util: float = 0.0  # percent of the last sample period a kernel ran
    memory_used_mb: float = 0.0
    memory_total_mb: float = 0.0
    power_w: float = 0.0
    temperature_c: float = 0.0
    ecc_uncorrected: int = 0  # volatile uncorrectable ECC errors since the driver loaded
    xid: int = 0  # the last critical Xid error seen since the previous reading (0: none)


@dataclass(frozen=True)
class HostReading:
    cpu_percent: float = 0.0  # of all cores
    memory_used_mb: float = 0.0
    memory_total_mb: float = 0.0
    disk_used_percent: float = 0.0
    net_rx_bps: float = 0.0
    net_tx_bps: float = 0.0


@dataclass(frozen=True)
class NodeReading:
    gpus: list[GpuReading]
    host: HostReading | None


class GpuSampler(Protocol):
    def read(self) -> list[GpuReading]: ...


class HostSampler(Protocol):
    def read(self) -> HostReading: ...


class NodeSource(Protocol):
    """Where the monitor's readings come from: node name -> that node's reading. A node that
    does not answer is left out (the inventory marks it down)."""

    def read(self) -> dict[str, NodeReading]: ...


class OneNode:
    """This machine's samplers, read in this process (the local executor's one node; also what
    a Ray node's sampler actor holds)."""

    def __init__(self, name: str, gpus: GpuSampler, host: HostSampler | None):
        self.name, self.gpus, self.host = name, gpus, host

    def reading(self) -> NodeReading:
        return NodeReading(self.gpus.read(), self.host.read() if self.host is not None else None)

    def read(self) -> dict[str, NodeReading]:
        return {self.name: self.reading()}


class FakeGpuSampler:
    """``n`` GPUs whose readings a test sets: ``set(0, util=80.0)``."""

    def __init__(self, n: int, memory_total_mb: float = 16384.0):
        self.gpus = [GpuReading(i, memory_total_mb=memory_total_mb) for i in range(n)]

    def set(self, index: int, **fields) -> None:
        self.gpus[index] = replace(self.gpus[index], **fields)

    def read(self) -> list[GpuReading]:
        return list(self.gpus)


class NoGpus:
    def read(self) -> list[GpuReading]:
        return []


class NvmlSampler:
    """The numbers nvidia-smi shows, through NVML (nvml.py)."""

    def __init__(self):
        self.nvml = Nvml()
        nv = self.nv = self.nvml.nv
        self.handles = self.nvml.handles
        self.events = None
        try:  # Xid errors arrive as events; not every driver or container lets us listen
            self.events = nv.nvmlEventSetCreate()
            for h in self.handles:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self.events)
        except nv.NVMLError as exc:
            log.info("Xid events are not available (%s): ECC counters only", exc)
            self.events = None

    def _xids(self) -> dict[int, int]:
        seen: dict[int, int] = {}
        if self.events is None:
            return seen
        while True:
            try:
                ev = self.nv.nvmlEventSetWait_v2(self.events, 0)
            except self.nv.NVMLError:  # timeout: no more events
                return seen
            try:
                seen[self.nv.nvmlDeviceGetIndex(ev.device)] = int(ev.eventData)
            except self.nv.NVMLError:  # a device that left between the event and now
                continue

    def _memory(self, i: int):
        """GPU ``i``'s memory as nvidia-smi shows it: NVML's version 2, whose ``used`` leaves
        out what the driver reserves (version 1 counts it: 600 MiB more on an idle H200); version
        1 where the driver or the library has no version 2."""
        v2 = getattr(self.nv, "nvmlMemory_v2", None)
        mem = self.nvml.get(i, self.nv.nvmlDeviceGetMemoryInfo, v2, default=None) if v2 is not None else None
        return mem if mem is not None else self.nvml.get(i, self.nv.nvmlDeviceGetMemoryInfo, default=None)

    def read(self) -> list[GpuReading]:
        nv, get = self.nv, self.nvml.get
        xids = self._xids()
        out = []
        for i in range(len(self.handles)):
            util = get(i, nv.nvmlDeviceGetUtilizationRates, default=None)
            mem = self._memory(i)
            ecc = get(i, nv.nvmlDeviceGetTotalEccErrors, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC,
                      default=0)
            xid = xids.get(i, 0)
            out.append(GpuReading(
                index=i, util=float(util.gpu) if util is not None else 0.0,
                memory_used_mb=mem.used / 2**20 if mem is not None else 0.0,
                memory_total_mb=mem.total / 2**20 if mem is not None else 0.0,
                power_w=get(i, nv.nvmlDeviceGetPowerUsage) / 1000.0,
                temperature_c=float(get(i, nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)),
                ecc_uncorrected=int(ecc), xid=xid if xid in CRITICAL_XIDS else 0))
        return out


def default_gpu_sampler(logical_gpus: int | None) -> GpuSampler:
    """NVML where the driver is there and no logical GPUs were asked for; else none to read."""
    if logical_gpus is not None:
        return NoGpus()
    try:
        return NvmlSampler()
    except Exception:  # no driver, no library, no GPU: a CPU machine
        return NoGpus()


class PsutilHostSampler:
    def __init__(self, disk_path: str = "/"):
        import psutil

        self.ps = psutil
        self.disk_path = disk_path
        psutil.cpu_percent(None)  # the first call starts the measuring window
        self._net = (time.monotonic(), psutil.net_io_counters())

    def read(self) -> HostReading:
        ps = self.ps
        vm = ps.virtual_memory()
        now, net = time.monotonic(), ps.net_io_counters()
        then, before = self._net
        dt = max(1e-3, now - then)
        self._net = (now, net)
        try:
            disk = ps.disk_usage(self.disk_path).percent
        except OSError:
            disk = 0.0
        return HostReading(cpu_percent=ps.cpu_percent(None), memory_used_mb=(vm.total - vm.available) / 2**20,
                           memory_total_mb=vm.total / 2**20, disk_used_percent=disk,
                           net_rx_bps=(net.bytes_recv - before.bytes_recv) / dt,
                           net_tx_bps=(net.bytes_sent - before.bytes_sent) / dt)


class FakeHostSampler:
    def __init__(self, reading: HostReading | None = None):
        self.reading = reading or HostReading(cpu_percent=10.0, memory_used_mb=1024, memory_total_mb=8192)

    def read(self) -> HostReading:
        return self.reading

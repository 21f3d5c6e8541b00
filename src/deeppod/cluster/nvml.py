"""The one NVML wrapper (nvidia-ml-py, the library nvidia-smi uses): what the GPU inventory
(gpus.NvmlProbe) and the monitoring readings (readings.NvmlSampler) ask of the driver."""

from __future__ import annotations


class Nvml:
    """NVML initialised, with a handle per GPU in index order; ``close()`` shuts it down.
    Raises ImportError without the library and ``pynvml.NVMLError`` without a driver."""

    def __init__(self) -> None:
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        try:
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError:
            pynvml.nvmlShutdown()
            raise

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.nv.nvmlShutdown()

    def identity(self, i: int) -> tuple[str, str, int]:
        """GPU ``i``'s UUID, model name and memory in MiB."""
        h = self.handles[i]
        return (_text(self.nv.nvmlDeviceGetUUID(h)), _text(self.nv.nvmlDeviceGetName(h)),
                int(self.nv.nvmlDeviceGetMemoryInfo(h).total // (1 << 20)))

    def get(self, i: int, fn, *args, default=0.0):
        """``fn(handle of GPU i, *args)``, or ``default`` where the driver does not say."""
        try:
            return fn(self.handles[i], *args)
        except self.nv.NVMLError:
            return default


    def links(self) -> list[list[int]]:
        """How each pair of GPUs is linked, as ``nvidia-smi topo -m`` says it, with
        scheduler/topology.py's levels: NVLink (to the peer's PCI bus, or to an NVSwitch, which
        links every GPU on it), else the PCIe ancestor they share. [] where NVML does not say."""
        from deeppod.scheduler.topology import NODE, NV, PHB, PIX, PXB, SYS

        nv, n = self.nv, len(self.handles)
        ancestors = {0: PIX, 10: PIX, 20: PXB, 30: PHB, 40: NODE, 50: SYS}  # nvmlGpuTopologyLevel_t
        buses = [_bus(self.get(i, nv.nvmlDeviceGetPciInfo, default=None)) for i in range(n)]
        peers: list[set[int]] = [set() for _ in range(n)]
        switched: set[int] = set()
        for i in range(n):
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                if self.get(i, nv.nvmlDeviceGetNvLinkState, link, default=0) != 1:
                    continue
                bus = _bus(self.get(i, nv.nvmlDeviceGetNvLinkRemotePciInfo, link, default=None))
                if bus in buses:
                    peers[i].add(buses.index(bus))
                elif bus:  # not a GPU of this node: an NVSwitch
                    switched.add(i)
        out = []
        for i in range(n):
            row = []
            for j in range(n):
                if i == j:
                    row.append(0)
                elif j in peers[i] or i in peers[j] or (i in switched and j in switched):
                    row.append(NV)
                else:
                    level = self.get(i, nv.nvmlDeviceGetTopologyCommonAncestor, self.handles[j], default=None)
                    if level is None:
                        return []
                    row.append(ancestors.get(int(level), SYS))
            out.append(row)
        return out


def _bus(pci) -> str:
    return _text(pci.busId).lower() if pci is not None else ""


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v

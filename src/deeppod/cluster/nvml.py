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


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v

"""The NVML sampler's memory figure, with NVML faked: what nvidia-smi shows as used."""

from types import SimpleNamespace

import pytest

from deeppod.cluster.readings import NvmlSampler

MiB = 2**20


@pytest.fixture
def nvml(monkeypatch):
    import pynvml

    asked = []

    def memory(handle, version=None):
        asked.append(version)
        if version is None:  # version 1: what the driver reserves counts as used
            return SimpleNamespace(total=143771 * MiB, used=1498 * MiB, free=142273 * MiB)
        if not fake.v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(total=143771 * MiB, reserved=615 * MiB, used=883 * MiB, free=142273 * MiB)

    fake = SimpleNamespace(v2=True, asked=asked)
    for name, fn in {"nvmlInit": lambda: None, "nvmlShutdown": lambda: None, "nvmlDeviceGetCount": lambda: 1,
                     "nvmlDeviceGetHandleByIndex": lambda i: i, "nvmlDeviceGetMemoryInfo": memory,
                     "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=100, memory=40),
                     "nvmlDeviceGetPowerUsage": lambda h: 684_000,
                     "nvmlDeviceGetTemperature": lambda h, sensor: 63,
                     "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: 0,
                     "nvmlEventSetCreate": lambda: "events", "nvmlDeviceRegisterEvents": lambda h, kinds, s: None,
                     "nvmlEventSetWait_v2": _no_event}.items():
        monkeypatch.setattr(pynvml, name, fn)
    return fake


def _no_event(events, timeout_ms):
    import pynvml

    raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)


def test_memory_used_leaves_out_what_the_driver_reserves(nvml):
    (r,) = NvmlSampler().read()
    assert (r.memory_used_mb, r.memory_total_mb, r.util, r.power_w) == (883, 143771, 100.0, 684.0)


def test_a_driver_without_version_2_gives_version_1s_figure(nvml):
    nvml.v2 = False
    (r,) = NvmlSampler().read()
    assert r.memory_used_mb == 1498 and nvml.asked[-1] is None

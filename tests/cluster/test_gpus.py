from deeppod.cluster.gpus import FakeProbe, GpuInfo, LogicalProbe, NvmlProbe, default_probe
from deeppod.cluster.inventory import local_node


def test_logical_slots():
    gpus = LogicalProbe(3).probe()
    assert [g.index for g in gpus] == [0, 1, 2] and all(g.logical for g in gpus)


def test_nvml_without_a_driver_is_empty_not_an_error(monkeypatch):
    import pynvml

    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    assert NvmlProbe().probe() == []


def test_nvml_lists_each_gpu_by_index_with_its_memory_in_mib(monkeypatch):
    import pynvml

    calls = []

    class Memory:
        total = 80 * 1024 * 1024 * 1024

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: calls.append("init"))
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: b"NVIDIA H100")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: f"GPU-{h}")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: Memory())
    assert NvmlProbe().probe() == [GpuInfo(0, "GPU-0", "NVIDIA H100", 81920, False),
                                   GpuInfo(1, "GPU-1", "NVIDIA H100", 81920, False)]
    assert calls == ["init", "shutdown"]


def test_default_probe_prefers_asked_for_logical_slots():
    assert isinstance(default_probe(2), LogicalProbe)
    assert isinstance(default_probe(None), NvmlProbe)


def test_local_node_uses_the_probe():
    fake = FakeProbe([GpuInfo(0, "GPU-abc", "H100", 81559, False)])
    node = local_node(fake, cpus=4, memory_mb=1000)
    assert node.cpus == 4 and node.memory_mb == 1000 and node.gpus[0].uuid == "GPU-abc"

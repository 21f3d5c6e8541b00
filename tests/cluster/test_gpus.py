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


def test_nvml_reads_how_the_gpus_are_linked(monkeypatch):
    """Four GPUs: 0-1 and 2-3 NVLinked pairs, 0-2 under one host bridge, the rest across the
    sockets; then the same four on an NVSwitch. The links go into the inventory and become the
    node's topology in the scheduler's snapshot."""
    import pynvml

    from deeppod.jobs.snapshot import topology_of
    from deeppod.scheduler.topology import NV, PHB, SYS

    class Pci:
        def __init__(self, bus):
            self.busId = bus.encode()

    class Memory:
        total = 80 << 30

    buses = [f"00000000:{b:02X}:00.0" for b in (0x10, 0x20, 0x30, 0x40)]
    for name, value in {"nvmlInit": lambda: None, "nvmlShutdown": lambda: None, "nvmlDeviceGetCount": lambda: 4,
                        "nvmlDeviceGetHandleByIndex": lambda i: i, "nvmlDeviceGetName": lambda h: b"H100",
                        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}", "nvmlDeviceGetMemoryInfo": lambda h: Memory(),
                        "nvmlDeviceGetPciInfo": lambda h: Pci(buses[h])}.items():
        monkeypatch.setattr(pynvml, name, value)
    pairs = {0: 1, 1: 0, 2: 3, 3: 2}
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", lambda h, link: 1 if link == 0 else 0)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo", lambda h, link: Pci(buses[pairs[h]]))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTopologyCommonAncestor",
                        lambda a, b: 30 if {a, b} == {0, 2} else 50)
    gpus = NvmlProbe().probe()
    assert gpus[0].links == (0, NV, PHB, SYS) and gpus[3].links == (SYS, SYS, NV, 0)
    topo = topology_of([g.to_dict() for g in gpus])
    assert topo is not None and topo.span((0, 1)) == NV and topo.span((0, 2)) == PHB
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo", lambda h, link: Pci("00000000:F0:00.0"))
    assert all(g.links.count(NV) == 3 for g in NvmlProbe().probe())  # one NVSwitch: every pair over NVLink
    assert topology_of([{"index": 0}, {"index": 1}]) is None  # logical slots say nothing


def test_without_nvlink_calls_the_links_are_unknown(monkeypatch):
    import pynvml

    class Memory:
        total = 1 << 30

    for name, value in {"nvmlInit": lambda: None, "nvmlShutdown": lambda: None, "nvmlDeviceGetCount": lambda: 2,
                        "nvmlDeviceGetHandleByIndex": lambda i: i, "nvmlDeviceGetName": lambda h: b"T4",
                        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}",
                        "nvmlDeviceGetMemoryInfo": lambda h: Memory()}.items():
        monkeypatch.setattr(pynvml, name, value)

    def unsupported(*a):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    for name in ("nvmlDeviceGetPciInfo", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetTopologyCommonAncestor"):
        monkeypatch.setattr(pynvml, name, unsupported)
    assert [g.links for g in NvmlProbe().probe()] == [(), ()]


def test_a_node_s_gpu_memory_is_its_smallest_healthy_gpu_s_and_slots_may_say_theirs():
    from deeppod.cluster.gpus import gpu_memory_of

    rows = [GpuInfo(0, "a", "A100", 81_920, False).to_dict(), GpuInfo(1, "b", "A100", 40_960, False).to_dict()]
    assert gpu_memory_of(rows) == 40_960
    assert gpu_memory_of([rows[0], {**rows[1], "healthy": False}]) == 81_920  # a cordoned GPU is not offered
    assert gpu_memory_of([*rows, GpuInfo(2, "c", "slot", 0, True).to_dict()]) == 0  # one does not say: not known
    assert gpu_memory_of([]) == 0
    assert [g.memory_mb for g in default_probe(2).probe()] == [0, 0]
    assert [g.memory_mb for g in default_probe(2, 16_384).probe()] == [16_384, 16_384]

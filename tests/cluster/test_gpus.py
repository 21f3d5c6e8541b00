from deeppod.cluster.gpus import FakeProbe, GpuInfo, LogicalProbe, NvmlProbe, default_probe
from deeppod.cluster.inventory import local_node


def test_logical_slots():
    gpus = LogicalProbe(3).probe()
    assert [g.index for g in gpus] == [0, 1, 2] and all(g.logical for g in gpus)


def test_nvml_without_a_driver_is_empty_not_an_error():
    assert isinstance(NvmlProbe().probe(), list)


def test_default_probe_prefers_asked_for_logical_slots():
    assert isinstance(default_probe(2), LogicalProbe)
    assert isinstance(default_probe(None), NvmlProbe)


def test_local_node_uses_the_probe():
    fake = FakeProbe([GpuInfo(0, "GPU-abc", "H100", 81559, False)])
    node = local_node(fake, cpus=4, memory_mb=1000)
    assert node.cpus == 4 and node.memory_mb == 1000 and node.gpus[0].uuid == "GPU-abc"

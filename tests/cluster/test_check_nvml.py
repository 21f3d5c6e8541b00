"""scripts/check_nvml.py's reading of ``nvidia-smi topo -m`` and its comparison with DeepPod's
view of a node (the script itself runs on a lent GPU machine)."""

import importlib.util
from pathlib import Path

from deeppod.scheduler.topology import dgx1

_spec = importlib.util.spec_from_file_location(
    "check_nvml", Path(__file__).resolve().parents[2] / "scripts" / "check_nvml.py")
check_nvml = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_nvml)

# What the lent H200 printed (benchmarks/results/check_nvml_h200_2026-11-27.txt), header underlined.
H200 = ("\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n")

# A DGX-1 (V100), NICs and all, as NVIDIA's documents print it.
DGX1 = """\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tmlx5_0\tmlx5_1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV1\tNV1\tNV2\tNV2\tSYS\tSYS\tSYS\tPIX\tSYS\t0-19,40-59\t0
GPU1\tNV1\t X \tNV2\tNV1\tSYS\tNV2\tSYS\tSYS\tPIX\tSYS\t0-19,40-59\t0
GPU2\tNV1\tNV2\t X \tNV2\tSYS\tSYS\tNV1\tSYS\tPHB\tSYS\t0-19,40-59\t0
GPU3\tNV2\tNV1\tNV2\t X \tSYS\tSYS\tSYS\tNV1\tPHB\tSYS\t0-19,40-59\t0
GPU4\tNV2\tSYS\tSYS\tSYS\t X \tNV1\tNV1\tNV2\tSYS\tPIX\t20-39,60-79\t1
GPU5\tSYS\tNV2\tSYS\tSYS\tNV1\t X \tNV2\tNV1\tSYS\tPIX\t20-39,60-79\t1
GPU6\tSYS\tSYS\tNV1\tSYS\tNV1\tNV2\t X \tNV2\tSYS\tPHB\t20-39,60-79\t1
GPU7\tSYS\tSYS\tSYS\tNV1\tNV2\tNV1\tNV2\t X \tSYS\tPHB\t20-39,60-79\t1
mlx5_0\tPIX\tPIX\tPHB\tPHB\tSYS\tSYS\tSYS\tSYS\t X \tSYS
mlx5_1\tSYS\tSYS\tSYS\tSYS\tPIX\tPIX\tPHB\tPHB\tSYS\t X
"""

SOCKET0, SOCKET1 = set(range(0, 20)) | set(range(40, 60)), set(range(20, 40)) | set(range(60, 80))
DGX1_BUSES = [f"00000000:{b}:00.0" for b in ("06", "07", "0a", "0b", "85", "86", "89", "8a")]
DGX1_ADDRESSES = [f"0000:{b}:00.0" for b in ("06", "07", "0a", "0b", "85", "86", "89", "8a")]


def test_one_gpu_s_cell_and_cores_are_read_through_the_underlined_header():
    assert check_nvml.topo_m(H200) == ([["X"]], ["0-15"])
    assert check_nvml.compare_topology(H200, [[0]], ["0000:0b:00.0"], ["00000000:0B:00.0"],
                                       [set(range(16))]) == []


def test_a_dgx1_s_gpu_columns_are_read_without_its_nics():
    links = [list(r) for r in dgx1().links]
    near = [SOCKET0] * 4 + [SOCKET1] * 4
    cells, cpus = check_nvml.topo_m(DGX1)
    assert len(cells) == 8 and all(len(r) == 8 for r in cells)
    assert cpus == ["0-19,40-59"] * 4 + ["20-39,60-79"] * 4
    assert check_nvml.compare_topology(DGX1, links, DGX1_ADDRESSES, DGX1_BUSES, near) == []


def test_each_difference_is_named():
    links = [list(r) for r in dgx1().links]
    links[0][5] = links[5][0] = 1  # NVML would say GPU 0 and 5 share NVLink
    near = [SOCKET1] + [SOCKET0] * 3 + [SOCKET1] * 3 + [None]
    problems = check_nvml.compare_topology(DGX1, links, DGX1_ADDRESSES[::-1], DGX1_BUSES, near)
    assert problems[0].startswith("links: NVML says")
    assert problems[1].startswith("PCI addresses in index order")
    assert problems[2].startswith("GPU 0 cores: local_cpulist [20,")
    assert problems[3] == "GPU 7: no local_cpulist for its PCI address"
    assert len(problems) == 4


def test_nvml_without_links_differs_from_a_matrix():
    assert check_nvml.compare_topology(H200, [], ["0000:0b:00.0"], ["00000000:0b:00.0"], [set(range(16))])

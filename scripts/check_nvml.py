"""DeepPod's GPU inventory and readings against nvidia-smi's, on a machine with NVIDIA GPUs.

    python scripts/check_nvml.py [--out FILE]

What the scheduler is told (cluster.gpus.NvmlProbe: each GPU's UUID, model and memory; the
links between GPUs that scheduler/topology.py places by) and what the monitor reads
(cluster.readings.NvmlSampler: utilization, memory in use) are compared with what
``nvidia-smi`` prints for the same GPUs, while a matrix product keeps GPU 0 busy. The link
matrix, each GPU's PCI address and the cores near it (executor/affinity.py: what a worker is
pinned to) are compared with ``nvidia-smi topo -m``'s matrix, "CPU Affinity" column and PCI
bus IDs (one GPU has no links, but its address and cores). Exits 1 on a difference, naming it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))



def smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=True).stdout


def smi_gpus() -> list[dict]:
    rows = smi("--query-gpu=index,uuid,name,memory.total,utilization.gpu,memory.used",
               "--format=csv,noheader,nounits")
    out = []
    for line in rows.strip().splitlines():
        index, uuid, name, total, util, used = (v.strip() for v in line.split(","))
        out.append({"index": int(index), "uuid": uuid, "name": name, "memory_mb": int(total),
                    "util": float(util), "used_mb": float(used)})
    return out


def topo_m(text: str) -> tuple[list[list[str]], list[str]]:
    """``nvidia-smi topo -m``'s GPU rows: the link cells between GPUs ("X", "NV4", "PIX"...)
    and each GPU's "CPU Affinity" cell ("0-15", or "" where it prints none)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # its header is underlined
    lines = text.splitlines()
    head = next((line.split("\t") for line in lines if "CPU Affinity" in line), None)
    if head is None:
        raise ValueError("nvidia-smi topo -m printed no header with 'CPU Affinity'")
    head = [h.strip() for h in head]
    gpus = [h for h in head if re.fullmatch(r"GPU\d+", h)]
    cpu_col = head.index("CPU Affinity")
    links, cpus = [], []
    for line in lines:
        cells = line.split("\t")
        if cells[0].strip() not in gpus:
            continue
        # a row's cells line up with the header's, whose first cell is the empty corner
        links.append([cells[head.index(g)].strip() for g in gpus])
        cpus.append(cells[cpu_col].strip() if cpu_col < len(cells) else "")
    return links, cpus


def _pci(address: str) -> tuple[int, str]:
    """A PCI address whatever its domain's width: NVML writes 00000000:0b:00.0, the kernel 0000:0b:00.0."""
    domain, _, rest = address.lower().partition(":")
    return int(domain or "0", 16), rest


def compare_topology(smi_text: str, links: list[list[int]], addresses: list[str], buses: list[str],
                     near: list[set[int] | None]) -> list[str]:
    """What differs between DeepPod's view of the node (NVML's link levels, the PCI addresses
    affinity.py maps indices to, the cores near each GPU) and ``nvidia-smi topo -m``'s."""
    from deeppod.executor.affinity import parse_list
    from deeppod.scheduler.topology import Topology

    problems: list[str] = []
    cells, cpus = topo_m(smi_text)
    theirs = Topology.parse(cells).links if cells else ()
    if [list(r) for r in theirs] != [list(r) for r in links]:
        problems.append(f"links: NVML says {links}, nvidia-smi topo -m says {[list(r) for r in theirs]}")
    if [_pci(a) for a in addresses] != [_pci(b) for b in buses]:
        problems.append(f"PCI addresses in index order: /proc/driver/nvidia/gpus gives {addresses}, NVML {buses}")
    for i, (mine, smis) in enumerate(zip(near, cpus)):
        if smis not in ("", "N/A") and mine is not None and mine != parse_list(smis):
            problems.append(f"GPU {i} cores: local_cpulist {sorted(mine)}, nvidia-smi topo -m {smis}")
        if mine is None:
            problems.append(f"GPU {i}: no local_cpulist for its PCI address")
    return problems


def busy(started: threading.Event, stop: threading.Event) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    a @ a
    torch.cuda.synchronize()
    started.set()
    while not stop.is_set():
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from deeppod.cluster.gpus import NvmlProbe
    from deeppod.cluster.nvml import Nvml, _bus
    from deeppod.cluster.readings import NvmlSampler
    from deeppod.executor import affinity

    problems: list[str] = []
    ours = NvmlProbe().probe()
    theirs = smi_gpus()
    print("probe:", [g.to_dict() for g in ours])
    print("nvidia-smi:", theirs)
    if len(ours) != len(theirs):
        problems.append(f"{len(ours)} GPUs probed, nvidia-smi lists {len(theirs)}")
    for g, s in zip(ours, theirs):
        for what, mine, smis in (("uuid", g.uuid, s["uuid"]), ("name", g.name, s["name"]),
                                 ("memory MiB", g.memory_mb, s["memory_mb"])):
            if mine != smis:
                problems.append(f"GPU {g.index} {what}: probe {mine!r}, nvidia-smi {smis!r}")
    with Nvml() as nvml:
        links = nvml.links()
        buses = [_bus(nvml.get(i, nvml.nv.nvmlDeviceGetPciInfo, default=None)) for i in range(len(nvml.handles))]
    print("links (scheduler/topology.py levels):", links)
    smi_topo = smi("topo", "-m")
    print(smi_topo)
    root = affinity.ROOT
    addresses = affinity.gpu_addresses(root)
    near = []
    for a_ in addresses:
        try:
            near.append(affinity.parse_list((root / affinity.PCI / a_ / "local_cpulist").read_text()))
        except OSError:
            near.append(None)
    print("PCI addresses (affinity.py):", addresses, "NVML:", buses)
    print("cores near each GPU (local_cpulist):", [affinity.format_list(c) if c else c for c in near])
    problems += compare_topology(smi_topo, links, addresses, buses, near)
    started, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=busy, args=(started, stop), daemon=True)
    worker.start()
    if not started.wait(120):
        problems.append("the matrix products did not start on GPU 0 within 120 s")
    time.sleep(2)  # NVML's utilization covers its last sample period (up to about a second)
    sampler = NvmlSampler()
    readings, smi_busy = [], []
    for _ in range(5):
        readings.append(sampler.read())
        smi_busy.append(smi_gpus())
        time.sleep(0.5)
    stop.set()
    worker.join()
    for r in readings[-1]:
        print("reading:", r)
    for i in range(len(theirs)):
        ours_util = [rs[i].util for rs in readings]
        smi_util = [ss[i]["util"] for ss in smi_busy]
        ours_used = [rs[i].memory_used_mb for rs in readings]
        smi_used = [ss[i]["used_mb"] for ss in smi_busy]
        print(f"GPU {i}: utilization ours {ours_util} / nvidia-smi {smi_util}; memory used MiB ours "
              f"{[round(v) for v in ours_used]} / nvidia-smi {smi_used}")
        if i == 0 and min(ours_util) < 50:
            problems.append(f"GPU 0 busy with matrix products, yet read at {min(ours_util)}% utilization")
        if abs(sorted(ours_util)[2] - sorted(smi_util)[2]) > 15:
            problems.append(f"GPU {i} utilization: ours {ours_util}, nvidia-smi {smi_util}")
        if abs(sorted(ours_used)[2] - sorted(smi_used)[2]) > 64:
            problems.append(f"GPU {i} memory used: ours {ours_used}, nvidia-smi {smi_used}")
    print("PROBLEMS:" if problems else "the probe and the readings agree with nvidia-smi", *problems, sep="\n  ")
    if a.out:
        a.out.write_text(json.dumps({"probe": [g.to_dict() for g in ours], "nvidia_smi": theirs, "links": links,
                                     "problems": problems}, indent=1, default=str))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

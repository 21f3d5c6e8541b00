"""DeepPod's GPU inventory and readings against nvidia-smi's, on a machine with NVIDIA GPUs.

    python scripts/check_nvml.py [--out FILE]

What the scheduler is told (cluster.gpus.NvmlProbe: each GPU's UUID, model and memory; the
links between GPUs that scheduler/topology.py places by) and what the monitor reads
(cluster.readings.NvmlSampler: utilization, memory in use) are compared with what
``nvidia-smi`` prints for the same GPUs, while a matrix product keeps GPU 0 busy. The link
matrix is printed beside ``nvidia-smi topo -m``'s (one GPU has none to compare). Exits 1 on
a difference, naming it.
"""

from __future__ import annotations

import argparse
import json
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
    from deeppod.cluster.nvml import Nvml
    from deeppod.cluster.readings import NvmlSampler

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
    print("links (scheduler/topology.py levels):", links)
    print(smi("topo", "-m"))
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

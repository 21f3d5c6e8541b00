"""The NVML sampler against nvidia-smi on a machine with NVIDIA GPUs (skipped elsewhere):
the same GPUs, the same memory, temperature and power within what a second between the two
reads can change."""

import shutil
import subprocess

import pytest

from deeppod.cluster.readings import NoGpus, default_gpu_sampler

pytestmark = pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no NVIDIA GPU here")
FIELDS = ("index,memory.used,memory.total,temperature.gpu,power.draw,utilization.gpu,"
          "ecc.errors.uncorrected.volatile.total")


def _smi() -> dict[int, dict]:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    rows = {}
    for line in out.strip().splitlines():
        v = [x.strip() for x in line.split(",")]
        num = [float(x) if x.replace(".", "", 1).isdigit() else 0.0 for x in v]
        rows[int(v[0])] = {"used": num[1], "total": num[2], "temp": num[3], "power": num[4], "util": num[5],
                           "ecc": num[6]}
    return rows


def test_nvml_reads_what_nvidia_smi_shows():
    pytest.importorskip("pynvml")
    sampler = default_gpu_sampler(None)
    assert not isinstance(sampler, NoGpus), "nvidia-smi works but NVML did not load"
    nv = {r.index: r for r in sampler.read()}
    smi = _smi()
    assert set(nv) == set(smi)
    for i, s in smi.items():
        r = nv[i]
        assert abs(r.memory_total_mb - s["total"]) <= 0.01 * s["total"] + 2, (i, r, s)
        # what the driver reserves is not "used" (NVML's version 1 counted 600 MiB more on an H200)
        assert abs(r.memory_used_mb - s["used"]) <= 64, (i, r, s)
        assert abs(r.temperature_c - s["temp"]) <= 5, (i, r, s)
        assert abs(r.power_w - s["power"]) <= max(30.0, 0.2 * s["power"]), (i, r, s)
        assert 0 <= r.util <= 100 and r.ecc_uncorrected == int(s["ecc"]), (i, r, s)

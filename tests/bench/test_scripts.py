"""Every script under benchmarks/ runs as documented, with its smallest settings: a benchmark
that no longer runs fails here, not the day someone needs its figures (issue 69: the Ray Serve
column had not been measured for several sessions, its turn dying on a None URL).

Each runs in a copy of benchmarks/ (its results files land there, never over the recorded
ones), against the repository's own src/, tests/ and scripts/. A peer that is not installed here (NVIDIA
DALI, Ray Serve, Ray Tune) is answered by tests/bench/fake_peer.py through the benchmark's own
``--dali-python`` / ``--ray-python``, so the code that starts and reads the peer runs too. The
figures are not looked at, only that the script ends well and prints its comparison."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT, wheel

TRACE = ROOT.parent / "shared" / "traces" / "philly-2017w45.csv"
TRACE_JOBS = 1500  # the trace's first jobs (about a day of it): a smoke run, not the week's figures
FAKE = "{fake}"
SMALL_TRACE = "{trace}"  # those jobs, written per test  # the stand-in peer's Python (written per test)
WHEELS = "{wheels}"  # a folder with one wheel made here (nothing is downloaded)

# script -> (its smallest settings, what its output must show)
SMOKE: dict[str, tuple[list[str], str]] = {
    "api_load.py": (["--jobs", "60", "--levels", "2", "--saturate", "2", "--seconds", "1", "--rounds", "1",
                     "--submits", "6", "--storm", "3", "--databases", "sqlite"], "floor"),
    "cgroup_overhead.py": (["--rounds", "1", "--pairs", "1", "--epochs", "1", "--memory-mb", "2048"], "worst round"),
    "cli_latency.py": (["--rounds", "1"], "x"),
    "cluster_control.py": (["--repeat", "1", "--failovers", "1"], "failover"),
    "console_pages.py": (["--jobs", "60", "--points", "500", "--rounds", "1"], "x"),
    "crowded_workers.py": (["--workers", "2", "--threads", "1", "--rounds", "1"], "x"),
    "data_loader.py": (["--images", "48", "--workers", "1", "--batch-size", "16", "--epochs", "2", "--rounds", "1",
                        "--dali-python", FAKE], "DALI"),
    # Ray's runtime_env needs virtualenv, which DeepPod does not install: DeepPod's side only
    "env_start.py": (["--rounds", "1", "--requirements", "deeppod-probe==1.0", "--find-links", WHEELS,
                      "--systems", "deeppod"], "a cached environment adds"),
    "idle_cpu.py": (["--seconds", "1", "--settle", "0", "--model", "mobilenet_v3_small", "--image-size", "32"],
                    "%"),
    "infer_throughput.py": (["--image-size", "32", "--concurrency", "1", "--duration", "1", "--rounds", "1",
                             "--slices", "1", "--ray-python", FAKE], "platform / ray_serve"),
    "large_model.py": (["--workers", "2", "--width", "32", "--layers", "1", "--seq", "8", "--steps", "1",
                        "--rounds", "1", "--configs", "ddp", "fsdp"], "fsdp"),
    "notebook_start.py": (["--rounds", "1", "--cells", "5"], "proxy / direct"),
    "monitor_overhead.py": (["--samples", "20", "--idle-seconds", "2", "--rounds", "1"], "%"),
    "resize.py": (["--quick", "--moves", "1:2", "--image-size", "32", "--batch-size", "4"], "restart / in place"),
    "resize_hooks.py": (["--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--steps", "2",
                         "--rounds", "1", "--give-ups", "1"], "hooked"),
    "s3_throughput.py": (["--rounds", "1", "--large", "1", "--small", "5", "--clients", "1", "--list-keys", "20"],
                         "moto"),
    "scheduler_bound.py": (["--trace", SMALL_TRACE, "--gpus", "256"], "deeppod / srpt"),
    "scheduler_philly.py": (["--trace", SMALL_TRACE, "--nodes", "32", "--runs", "fifo", "deeppod", "--tag", "smoke"],
                            "fifo"),
    "scheduler_round.py": (["--queued", "100", "--nodes", "8", "--repeat", "1"], "x"),
    "topology_placement.py": (["--nodes", "4", "--jobs", "200", "--seeds", "1"], "tightest"),
    "train_throughput.py": (["--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--workers", "2",
                             "--steps", "2", "--rounds", "1"], "ratio"),
    "slurm_overhead.py": (["--rounds", "1", "--steps", "20"], "deeppod / plain"),
    "tune.py": (["--task", "digits", "--trials", "2", "--parallel", "1", "--epochs", "3", "--systems", "optuna,deeppod",
                 "--ray-python", FAKE], "ray vs optuna"),
}
# scripts another one runs (with what it is given): covered by that one's run
RUN_BY = {"api_floor.py": "api_load.py", "bare_train.py": "train_throughput.py", "tune_task.py": "tune.py",
          "dali_pipeline.py": "data_loader.py (the stand-in answers as it would)",
          "ray_serve_app.py": "infer_throughput.py (the stand-in answers as it would)"}
# what needs a machine this is not
NEEDS_GPU = {"largest_model.py": "the largest model that trains on one GPU: a search of GPU memory caps"}


def test_every_benchmark_is_run_here_or_by_another():
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    assert scripts == set(SMOKE) | set(RUN_BY) | set(NEEDS_GPU), scripts ^ (set(SMOKE) | set(RUN_BY) | set(NEEDS_GPU))


@pytest.fixture
def sandbox(tmp_path):
    """A copy of benchmarks/ beside links to the repository's src/, tests/ and scripts/."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "benchmarks", root / "benchmarks", ignore=shutil.ignore_patterns("__pycache__", "results"))
    (root / "benchmarks" / "results").mkdir()
    for name in ("src", "tests", "scripts", "pyproject.toml"):
        (root / name).symlink_to(ROOT / name)
    fake = tmp_path / "peer-python"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests' / 'bench' / 'fake_peer.py'} \"$@\"\n")
    fake.chmod(0o755)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels, "deeppod-probe", "1.0", "probe")
    trace = tmp_path / "trace.csv"
    if TRACE.exists():
        with TRACE.open() as src:
            trace.write_text("".join(line for _, line in zip(range(TRACE_JOBS + 1), src)))
    return root, {FAKE: str(fake), WHEELS: str(wheels), SMALL_TRACE: str(trace)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_the_benchmark_runs_with_its_smallest_settings(script, sandbox, tmp_path):
    if script in ("scheduler_bound.py", "scheduler_philly.py") and not TRACE.exists():
        pytest.skip(f"no trace at {TRACE}")
    root, values = sandbox
    args, shows = SMOKE[script]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPPOD_", "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    p = subprocess.run([sys.executable, str(root / "benchmarks" / script), *(values.get(a, a) for a in args)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert shows in out, out[-6000:]

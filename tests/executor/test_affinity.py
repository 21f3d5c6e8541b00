"""Workers pinned to the cores near their GPUs: read from the kernel's own files (a fake
two-socket node here), and only where it helps and takes nothing from the worker."""

import os
import subprocess
import sys

import pytest

from deeppod.executor import affinity
from deeppod.executor.base import LaunchSpec, WorkerSpec
from deeppod.executor.local import write_spec
from deeppod.executor.supervisor import Supervisor


def node(root, sockets: dict[str, list[str]]):
    """A fake /proc and /sys: GPUs at PCI addresses, each with its NUMA node's cores."""
    for cores, addresses in sockets.items():
        for a in addresses:
            (root / affinity.GPUS / a).mkdir(parents=True)
            (root / affinity.PCI / a).mkdir(parents=True)
            (root / affinity.PCI / a / "local_cpulist").write_text(cores + "\n")
    return root


def test_the_kernels_cpu_lists_read_and_write():
    assert affinity.parse_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert affinity.parse_list("") == set()
    assert affinity.format_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"


def test_a_worker_is_pinned_to_its_gpus_socket_only_where_that_helps(tmp_path):
    # two sockets, 16 cores each; GPUs 0-1 on the first, 2-3 on the second (listed out of order)
    root = node(tmp_path, {"0-15": ["0000:07:00.0", "0000:0f:00.0"], "16-31": ["0000:87:00.0", "0000:8f:00.0"]})
    everything = set(range(32))
    assert affinity.near([0], 4, root, everything) == set(range(16))
    assert affinity.near([2, 3], 8, root, everything) == set(range(16, 32))
    assert affinity.near([1, 2], 4, root, everything) is None  # both sockets: the whole node
    assert affinity.near([3], 20, root, everything) is None  # asked for more cores than its socket has
    assert affinity.near([0], 4, root, set(range(8, 24))) == set(range(8, 16))  # only what this process may use
    assert affinity.near([4], 1, root, everything) is None  # no such GPU (logical slots)
    assert affinity.near([], 1, root, everything) is None
    assert affinity.near([0], 1, tmp_path / "no-driver", everything) is None
    one = node(tmp_path / "one", {"0-31": ["0000:07:00.0", "0000:0f:00.0"]})
    assert affinity.near([0], 1, one, everything) is None  # one NUMA node: nothing to choose
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "OMP_NUM_THREADS": "8"}
    assert affinity.for_worker(env, root) in (None, set(range(16, 32)) & set(os.sched_getaffinity(0)))
    assert affinity.for_worker({"CUDA_VISIBLE_DEVICES": "GPU-1f2e", "OMP_NUM_THREADS": "1"}, root) is None
    assert affinity.for_worker({"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}, root) is None


@pytest.mark.slow  # it starts processes
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin to one")
def test_the_supervisor_starts_a_worker_on_its_gpus_cores(tmp_path, monkeypatch):
    last = max(os.sched_getaffinity(0))
    monkeypatch.setattr(affinity, "ROOT", node(tmp_path / "node", {str(last): ["0000:07:00.0"]}))
    job_dir = tmp_path / "job"
    show = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "1"}
    write_spec(LaunchSpec(job_id=1, job_dir=job_dir, command=show, workdir=str(tmp_path),
                          workers=[WorkerSpec(0, "n", env)]))
    sup = Supervisor(job_dir)
    log_path = tmp_path / "rank-0.log"
    with open(log_path, "ab", buffering=0) as log:
        p = sup._popen("0", env, log, subprocess.DEVNULL)
    assert p.wait(60) == 0
    text = log_path.read_text()
    assert f"runs on cores {last}, near its GPUs" in text and f"[{last}]" in text
    with open(log_path, "ab", buffering=0) as log:  # logical slots: the whole machine
        p = sup._popen("0", {**env, "CUDA_VISIBLE_DEVICES": "5"}, log, subprocess.DEVNULL)
    assert p.wait(60) == 0
    assert str(sorted(os.sched_getaffinity(0))) in log_path.read_text()


@pytest.mark.slow  # it starts processes
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin to one")
def test_a_running_tree_is_pinned_thread_by_thread(tmp_path):
    """A warm spare handed a GPU worker's place is running already, with threads and a child
    (its loader's fork server): all of them move to the cores, and what they start later too."""
    last = max(os.sched_getaffinity(0))
    ready = tmp_path / "ready"
    code = ("import os, subprocess, sys, threading, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            f"open({str(ready)!r}, 'w').write(str(child.pid))\n"
            "sys.stdin.readline()\n"  # pinned by now: what is started next inherits it
            "late = subprocess.Popen([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],"
            " stdout=subprocess.PIPE, text=True)\n"
            "print(late.communicate()[0].strip(), flush=True)\n"
            "child.kill()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        from tests.helpers import wait_until

        wait_until(lambda: ready.exists() and ready.read_text(), 30, what="the tree to start")
        child = int(ready.read_text())
        assert affinity.pin_tree(p.pid, {last}) >= 3  # its main thread, its own thread, the child's
        for pid in (p.pid, child):
            for tid in os.listdir(f"/proc/{pid}/task"):
                assert os.sched_getaffinity(int(tid)) == {last}
        out, _ = p.communicate("go\n", timeout=60)
        assert out.strip() == f"[{last}]"
    finally:
        p.kill()
    assert affinity.pin_tree(p.pid, {last}) == 0  # gone: nothing to pin, no error


def test_threads_that_outnumber_the_cores_are_told_to_sleep_when_idle():
    def workers(*threads, **extra):
        return [{"rank": r, "env": {"OMP_NUM_THREADS": str(t), **extra}} for r, t in enumerate(threads)]

    crowded = workers(2, 2, 2)  # 6 math threads on 2 cores
    assert affinity.quiet_threads(crowded, cores=2) == [0, 1, 2]
    assert [w["env"][affinity.WAIT_POLICY] for w in crowded] == ["PASSIVE"] * 3
    assert not affinity.quiet_threads(crowded, cores=2)  # said already: nothing changes

    roomy = workers(1, 1)
    assert not affinity.quiet_threads(roomy, cores=2)
    assert all(affinity.WAIT_POLICY not in w["env"] for w in roomy)  # they spin: no one else needs the cores
    offered = [{**w, "node_cpus": 2} for w in workers(1, 1)]  # the server offers what the node has
    assert not affinity.quiet_threads(offered, cores=2)

    # the job fits, but the server offers 4 CPUs on this 2-core node: another job may share them
    over = [{**w, "node_cpus": 4} for w in workers(2)]
    assert affinity.quiet_threads(over, cores=2) == [0]
    single = [{**w, "node_cpus": 4} for w in workers(1, 1, 1)]  # one thread each: no pool that could spin
    assert not affinity.quiet_threads(single, cores=2) and all(affinity.WAIT_POLICY not in w["env"] for w in single)

    own = workers(4, 4, OMP_WAIT_POLICY="ACTIVE")  # the job's own choice stands
    assert not affinity.quiet_threads(own, cores=2)
    assert {w["env"][affinity.WAIT_POLICY] for w in own} == {"ACTIVE"}


@pytest.mark.slow  # it starts processes
def test_the_supervisor_quiets_a_crowded_jobs_threads_before_they_start(tmp_path):
    """Workers whose threads outnumber this machine's cores start with OMP_WAIT_POLICY=PASSIVE
    (libgomp reads it once, as torch loads it); a job that fits starts without it."""
    cores = len(os.sched_getaffinity(0))
    show = [sys.executable, "-c", "import os; print('policy', os.environ.get('OMP_WAIT_POLICY'))"]
    cases = (("crowded", 2, cores, None, "PASSIVE"), ("fits", 1, 1, None, None), ("fits", 1, 1, cores, None),
             ("over-offered", 1, 2, cores + 2, "PASSIVE"))
    for n, (name, workers, threads, offered, want) in enumerate(cases):
        job_dir = tmp_path / f"{name}-{n}"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        env.pop("OMP_WAIT_POLICY", None)
        write_spec(LaunchSpec(job_id=1, job_dir=job_dir, command=show, workdir=str(tmp_path),
                              workers=[WorkerSpec(r, "n", dict(env), offered) for r in range(workers)]))
        p = subprocess.run([sys.executable, "-m", "deeppod.executor.supervisor", str(job_dir)], timeout=120)
        assert p.returncode == 0
        for rank in range(workers):
            log = (job_dir / "logs" / f"rank-{rank}.log").read_text()
            assert f"policy {want}" in log, name
            assert ("sleep when idle (OMP_WAIT_POLICY=PASSIVE)" in log) == (want is not None), log  # it says why

"""The local executor and its supervisor, with real processes."""

import json
import os
import signal
import sys
import textwrap
import time

import pytest

from deeppod.contract import worker_env
from deeppod.executor.base import LaunchSpec, WorkerSpec
from deeppod.executor.local import LocalExecutor, process_start_time
from tests.helpers import wait_until


def launch(tmp_path, script: str, workers=2, grace=5.0, memory=None, ex=None):
    ex = ex or LocalExecutor()
    (tmp_path / "w.py").write_text(textwrap.dedent(script))
    env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"}
    spec = LaunchSpec(job_id=1, job_dir=tmp_path / "job", command=[sys.executable, "w.py"], workdir=str(tmp_path),
                      workers=[WorkerSpec(r, "n", {**env, "RANK": str(r)}) for r in range(workers)],
                      grace_seconds=grace, memory_mb_per_worker=memory)
    return ex, ex.launch(spec)


def finished(ex, handle, timeout=30):
    return wait_until(lambda: (st := ex.poll(handle)).finished and st, timeout, what="the job to end")


def test_success_records_every_exit_code_and_logs(tmp_path):
    ex, h = launch(tmp_path, "import os; print('hello from', os.environ['RANK'])")
    st = finished(ex, h)
    assert st.exit_codes == {0: 0, 1: 0} and not st.stopped and not st.lost
    assert (tmp_path / "job/logs/rank-1.log").read_text() == "hello from 1\n"
    assert (tmp_path / "job/exit/rank-0").read_text() == "0"


def test_a_worker_killed_by_a_fatal_signal_leaves_its_python_stack_in_its_log(tmp_path):
    ex = LocalExecutor()
    (tmp_path / "w.py").write_text("import os\n\ndef deep_in_a_library():\n    os.abort()\n\ndeep_in_a_library()\n")
    env = worker_env({"PATH": os.environ["PATH"]}, {}, job_id=1, rank=0, world_size=1, local_rank=0,
                     local_world_size=1, node_rank=0, master_addr="127.0.0.1", master_port=1, gpus=(), cpus=1,
                     checkpoint_dir=str(tmp_path / "ckpt"), api_url="", token="")
    h = ex.launch(LaunchSpec(job_id=1, job_dir=tmp_path / "job", command=[sys.executable, "w.py"],
                             workdir=str(tmp_path), workers=[WorkerSpec(0, "n", env)], grace_seconds=5.0))
    st = finished(ex, h)
    assert st.exit_codes == {0: -signal.SIGABRT}
    assert st.reason.startswith("rank 0 was killed by SIGABRT; a crash") and "log shows where" in st.reason, st.reason
    log = (tmp_path / "job/logs/rank-0.log").read_text()
    assert "Fatal Python error: Aborted" in log and "deep_in_a_library" in log, log


def test_a_restarted_server_finds_the_run_it_launched_and_no_other(tmp_path):
    ex = LocalExecutor()
    (tmp_path / "w.py").write_text("import time; time.sleep(60)\n")
    env = {"PATH": os.environ["PATH"], "RANK": "0"}
    h = ex.launch(LaunchSpec(job_id=1, job_dir=tmp_path / "job", command=[sys.executable, "w.py"],
                             workdir=str(tmp_path), workers=[WorkerSpec(0, "n", env)], grace_seconds=1.0,
                             run="2026-12-03T15:00:00+00:00"))
    try:
        # a later run: never launched
        assert LocalExecutor().find(1, tmp_path / "job", "2026-12-03T16:00:00+00:00") is None
        found = LocalExecutor().find(1, tmp_path / "job", "2026-12-03T15:00:00+00:00")  # a new server's executor
        assert found is not None
        wait_until(lambda: not LocalExecutor().poll(found).finished and (tmp_path / "job/supervisor.json").exists(), 30)
    finally:
        ex.terminate(h)
        finished(ex, h)
    spec = json.loads((tmp_path / "job/spec.json").read_text())
    del spec["run"]  # written by a server from before specs named their run: taken as the run asked for
    (tmp_path / "job/spec.json").write_text(json.dumps(spec))
    assert LocalExecutor().find(1, tmp_path / "job", "2026-12-03T16:00:00+00:00") is not None


def test_one_failure_stops_the_others(tmp_path):
    ex, h = launch(tmp_path, """
        import os, sys, time
        if os.environ['RANK'] == '1':
            sys.exit(3)
        time.sleep(60)
    """)
    t0 = time.monotonic()
    st = finished(ex, h)
    assert time.monotonic() - t0 < 15
    assert st.exit_codes[1] == 3 and st.exit_codes[0] == -signal.SIGTERM
    assert st.reason == "rank 1 exited with code 3"


def test_terminate_gives_a_grace_period_then_sigkill(tmp_path):
    ex, h = launch(tmp_path, """
        import os, signal, sys, time
        rank = os.environ['RANK']
        def on_term(*_):
            if rank == '0':
                print('saving checkpoint', flush=True)
                sys.exit(0)
            # rank 1 ignores SIGTERM and must be killed after the grace period
        signal.signal(signal.SIGTERM, on_term)
        print('ready', flush=True)
        while True:
            time.sleep(0.1)
    """, grace=2.0)
    wait_until(lambda: all((tmp_path / f"job/logs/rank-{r}.log").exists() and "ready" in
                           (tmp_path / f"job/logs/rank-{r}.log").read_text() for r in (0, 1)), 20)
    t0 = time.monotonic()
    ex.terminate(h)
    st = finished(ex, h)
    took = time.monotonic() - t0
    assert st.stopped
    assert st.exit_codes == {0: 0, 1: -signal.SIGKILL}
    assert 1.8 <= took < 10
    assert "saving checkpoint" in (tmp_path / "job/logs/rank-0.log").read_text()


CHILD = """
import os, signal, time
signal.signal(signal.SIGTERM, lambda *_: os.write(1, b"child got SIGTERM\\n"))  # not print: reentrant
print("child ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_sigterm_reaches_only_the_worker_process_and_its_children_are_killed_after(tmp_path):
    """Loader workers and other children must live while the worker finishes its step and
    saves (they die of SIGTERM first otherwise); once it exits, its group goes."""
    (tmp_path / "child.py").write_text(CHILD)
    ex, h = launch(tmp_path, """
        import signal, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "child.py"])
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        print('ready', flush=True)
        while not stop:
            time.sleep(0.05)
        time.sleep(0.5)  # "the last step": a group-wide SIGTERM would have reached the child by now
        print('child alive while saving:', child.poll() is None, flush=True)
        open('child.pid', 'w').write(str(child.pid))
        sys.exit(75)
    """, workers=1, grace=10.0)
    log = tmp_path / "job/logs/rank-0.log"
    wait_until(lambda: log.exists() and "ready" in log.read_text() and "child ready" in log.read_text(), 20)
    ex.terminate(h)
    st = finished(ex, h)
    out = log.read_text()
    assert st.exit_codes == {0: 75} and st.stopped, out
    assert "child alive while saving: True" in out and "child got SIGTERM" not in out
    child = int((tmp_path / "child.pid").read_text())
    wait_until(lambda: process_start_time(child) is None, 10, what="the left-over child to be killed")


def test_memory_request_is_enforced(tmp_path):
    ex, h = launch(tmp_path, """
        import time
        hog = bytearray(200 * 1024 * 1024)
        for i in range(0, len(hog), 4096):
            hog[i] = 1
        time.sleep(30)
    """, workers=1, memory=100)
    st = finished(ex, h)
    assert st.exit_codes[0] == -signal.SIGKILL
    assert "exceeded its memory request of 100 MiB" in st.reason


def test_usage_counts_every_process_of_the_job_and_ends_with_it(tmp_path):
    """CPU seconds and resident memory of the supervisor's whole tree: both workers, and a
    child each forks (as a DataLoader's workers are), read while they run; nothing once ended."""
    ex, h = launch(tmp_path, """
        import os, time
        block = bytearray(40 * 2**20)  # 40 MiB each, touched
        for i in range(0, len(block), 4096):
            block[i] = 1
        os.fork()  # a child that burns CPU as its parent does
        end = time.monotonic() + 120
        while time.monotonic() < end and not os.path.exists("stop"):
            pass
    """)
    wait_until(lambda: (u := ex.usage(h)) is not None and u.cpu_seconds > 1.0, 60, what="CPU counted")
    u = ex.usage(h)
    assert u.memory_mb > 2 * 40, u  # the two workers' blocks at least (their children share theirs)
    (tmp_path / "stop").write_text("")
    finished(ex, h)
    wait_until(lambda: ex.usage(h) is None, 30, what="the supervisor to exit after its result")
    assert ex.usage({"kind": "local", "job_dir": str(tmp_path / "job"), "pid": h["pid"], "start_time": 1}) is None


def test_unknown_executable_fails_cleanly(tmp_path):
    ex = LocalExecutor()
    spec = LaunchSpec(job_id=1, job_dir=tmp_path / "job", command=["/nonexistent/prog"], workdir=str(tmp_path),
                      workers=[WorkerSpec(0, "n", {"PATH": "/usr/bin"})])
    st = finished(ex, ex.launch(spec))
    assert st.exit_codes == {0: 127} and "could not start" in st.reason


def test_a_vanished_supervisor_is_reported_and_its_workers_killed(tmp_path):
    ex, h = launch(tmp_path, "import time; time.sleep(60)", workers=1)
    wait_until(lambda: (tmp_path / "job/workers.json").exists(), 20)
    worker = int(json.loads((tmp_path / "job/workers.json").read_text())["0"])
    os.kill(h["pid"], signal.SIGKILL)
    st = finished(ex, h)
    assert st.lost and "died unexpectedly" in st.reason
    wait_until(lambda: process_start_time(worker) is None, 10, what="the orphaned worker to be killed")


def test_a_new_executor_finds_a_running_job_again(tmp_path):
    """What a restarted server does: a fresh executor object, the stored handle."""
    ex, h = launch(tmp_path, "import time; time.sleep(1.5); print('done')", workers=1)
    again = LocalExecutor()
    assert not again.poll(h).finished
    st = finished(again, h)
    assert st.exit_codes == {0: 0}
    ex.poll(h)  # reap in the original owner


def test_handle_without_pid_is_recovered_from_the_job_folder(tmp_path):
    ex, h = launch(tmp_path, "import time; time.sleep(1.5)", workers=1)
    wait_until(lambda: (tmp_path / "job/supervisor.json").exists(), 10)
    bare = {"kind": "local", "job_dir": h["job_dir"]}
    assert not LocalExecutor().poll(bare).finished
    assert finished(ex, h).exit_codes == {0: 0}


SPARE_JOB = """
    import os, sys, time
    from deeppod import runtime
    ctx = runtime.init()
    print("rank", ctx.rank, "pid", os.getpid(), flush=True)
    if ctx.rank == 0:
        while not os.path.exists("done"):
            time.sleep(0.05)
"""


@pytest.fixture
def spare_job(tmp_path):
    ex, h, env, ckpt = _spare_job(tmp_path)
    yield ex, h, env, ckpt
    (tmp_path / "done").write_text("")  # whatever the test did, nothing of it outlives it
    ex.terminate(h)
    finished(ex, h)


def _spare_job(tmp_path):
    ex = LocalExecutor()
    (tmp_path / "w.py").write_text(textwrap.dedent(SPARE_JOB))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1", "DEEPPOD_CHECKPOINT_DIR": str(ckpt),
           "WORLD_SIZE": "1", "DEEPPOD_TOKEN": "secret"}
    spec = LaunchSpec(job_id=1, job_dir=tmp_path / "job", command=[sys.executable, "w.py"], workdir=str(tmp_path),
                      workers=[WorkerSpec(0, "n", {**env, "RANK": "0"})], grace_seconds=5)
    return ex, ex.launch(spec), env, ckpt


def test_a_grow_hands_the_new_worker_to_a_warm_spare(tmp_path, spare_job):
    ex, h, env, ckpt = spare_job
    ex.keep_spares(h, 1)
    mark = ckpt / ".spare-parked-0"
    wait_until(mark.exists, 60, what="the spare to park")
    spare_pid = int(mark.read_text())
    assert pid_recorded(tmp_path, "spare-0") == spare_pid  # a vanished supervisor's strays include it
    ex.add_workers(h, [WorkerSpec(1, "n", {**env, "RANK": "1"})], 1)
    log = tmp_path / "job/logs/rank-1.log"
    wait_until(lambda: "rank 1 pid" in log.read_text() if log.exists() else False, 30, what="rank 1 to run")
    assert log.read_text() == (f"deeppod: rank 1 starts from warm spare 0 (pid {spare_pid})\n"
                               f"rank 1 pid {spare_pid}\n")
    assert pid_recorded(tmp_path, "1") == spare_pid
    (tmp_path / "done").write_text("")
    st = finished(ex, h)
    assert st.exit_codes == {0: 0, 1: 0}
    # the spare's own log has what it ran before the park; the token was not in its env
    assert (tmp_path / "job/logs/spare-0.log").read_text() == ""
    assert not (tmp_path / "job/logs/spare-1.log").exists()  # no other spare until the control plane asks


def test_spares_go_when_no_longer_wanted_and_when_the_job_ends(tmp_path, spare_job):
    ex, h, env, ckpt = spare_job
    ex.keep_spares(h, 2)
    wait_until(lambda: all((ckpt / f".spare-parked-{n}").exists() for n in (0, 1)), 60, what="two spares to park")
    pids = [int((ckpt / f".spare-parked-{n}").read_text()) for n in (0, 1)]
    time.sleep(0.05)  # a new mtime
    ex.keep_spares(h, 1)
    wait_until(lambda: not (ckpt / ".spare-parked-1").exists(), 30, what="spare 1 to go")
    wait_until(lambda: process_start_time(pids[1]) is None, 30, what="spare 1's process to end")
    (tmp_path / "done").write_text("")
    st = finished(ex, h)
    assert st.exit_codes == {0: 0}  # a spare is not a worker: its end is no exit code of the job's
    wait_until(lambda: process_start_time(pids[0]) is None, 30, what="spare 0's process to end")
    assert not (ckpt / ".spare-parked-0").exists()


def test_a_stop_takes_the_spares_with_it(tmp_path, spare_job):
    ex, h, env, ckpt = spare_job
    ex.keep_spares(h, 1)
    wait_until((ckpt / ".spare-parked-0").exists, 60, what="the spare to park")
    pid = int((ckpt / ".spare-parked-0").read_text())
    ex.terminate(h)
    st = finished(ex, h)
    assert st.stopped
    wait_until(lambda: process_start_time(pid) is None, 30, what="the spare's process to end")


def pid_recorded(tmp_path, name: str) -> int:
    """The pid the supervisor recorded for ``name`` (it writes the file after the process
    started, so after what the process itself printed)."""
    pids = tmp_path / "job/workers.json"
    wait_until(lambda: pids.exists() and name in json.loads(pids.read_text()), 30, what=f"{name}'s pid recorded")
    return json.loads(pids.read_text())[name]


def start_one_spare(tmp_path, ex, h, prelude: str) -> int:
    """A spare whose script runs ``prelude`` (under DEEPPOD_SPARE) before SPARE_JOB: its pid."""
    (tmp_path / "w.py").write_text(f"import os, sys, time\nif os.environ.get('DEEPPOD_SPARE'):\n    {prelude}\n"
                                   + textwrap.dedent(SPARE_JOB))
    ex.keep_spares(h, 1)
    return pid_recorded(tmp_path, "spare-0")  # its log is opened before it starts: the pid file says it did


def grow_to_rank_1(tmp_path, ex, h, env) -> str:
    """Add rank 1 and wait until it runs: its log."""
    ex.add_workers(h, [WorkerSpec(1, "n", {**env, "RANK": "1"})], 1)
    log = tmp_path / "job/logs/rank-1.log"
    wait_until(lambda: "rank 1 pid" in log.read_text() if log.exists() else False, 60, what="rank 1 to run")
    return log.read_text()


def test_a_spare_still_starting_is_handed_the_worker_and_runs_it_once_it_parks(tmp_path, spare_job):
    ex, h, env, ckpt = spare_job
    spare_pid = start_one_spare(tmp_path, ex, h, "time.sleep(3)  # still importing")
    assert not (ckpt / ".spare-parked-0").exists()
    # no second process beside it: the spare, further along, became rank 1 when it parked
    assert grow_to_rank_1(tmp_path, ex, h, env) == (f"deeppod: rank 1 starts from spare still starting 0 "
                                                    f"(pid {spare_pid})\nrank 1 pid {spare_pid}\n")
    assert pid_recorded(tmp_path, "1") == spare_pid
    wait_until(lambda: "spare-0" not in json.loads((tmp_path / "job/workers.json").read_text()), 30,
               what="the spare's pid to be taken off once it is rank 1")
    (tmp_path / "done").write_text("")
    st = finished(ex, h)
    assert st.exit_codes == {0: 0, 1: 0}


def test_a_spare_that_dies_while_starting_is_not_handed_a_worker(tmp_path, spare_job):
    ex, h, env, ckpt = spare_job
    spare_pid = start_one_spare(tmp_path, ex, h, "sys.exit(3)  # its imports failed")
    wait_until(lambda: process_start_time(spare_pid) is None, 30, what="the spare to exit")
    assert "spare" not in grow_to_rank_1(tmp_path, ex, h, env)  # started cold
    (tmp_path / "done").write_text("")
    assert finished(ex, h).exit_codes == {0: 0, 1: 0}

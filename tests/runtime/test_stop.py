"""runtime.StopGuard: a stop that finds the loop in a step longer than the grace still ends
with the last completed step saved, well inside the grace, and exit code 75."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from deeppod.contract import EXIT_RESUME

pytestmark = pytest.mark.slow  # its tests start processes (tests/conftest.py)

LOOP = textwrap.dedent("""
    import json, os, sys, time
    from deeppod.runtime import stop

    stop.install()
    state = {"step": 0}
    out = sys.argv[1]

    def save():
        with open(out, "w") as f:
            json.dump(dict(state), f)

    guard = stop.StopGuard(save, rank=0, grace=float(sys.argv[2]))
    while True:
        print(f"step {state['step']}", flush=True)
        time.sleep(float(sys.argv[3]))  # the step's forward and backward
        with guard:                      # its update
            state["step"] += 1
        if stop.should_stop():
            with guard:
                guard.handled()
                state["by"] = "loop"
                save()
            stop.exit_for_resume()
""")


def run(tmp_path, grace, step_seconds, stop_after_steps):
    out = tmp_path / "saved.json"
    p = subprocess.Popen([sys.executable, "-c", LOOP, str(out), str(grace), str(step_seconds)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    while len(seen) <= stop_after_steps:
        seen.append(p.stdout.readline())
    began = time.monotonic()
    p.send_signal(signal.SIGTERM)
    code = p.wait(timeout=60)
    return code, time.monotonic() - began, out.read_text(), p.stderr.read()


def test_a_step_longer_than_the_grace_saves_the_last_completed_step(tmp_path):
    code, took, saved, err = run(tmp_path, grace=4.0, step_seconds=60, stop_after_steps=0)
    assert code == EXIT_RESUME, err
    assert saved == '{"step": 0}'  # the step in progress never completed: not half of it
    assert took < 4.0, took  # 40% of the grace, then the save: before the SIGKILL would come
    assert "saving the last completed step" in err


def test_a_loop_that_reaches_its_stop_path_in_time_saves_by_itself(tmp_path):
    code, took, saved, err = run(tmp_path, grace=20.0, step_seconds=0.05, stop_after_steps=3)
    assert code == EXIT_RESUME, err
    assert '"by": "loop"' in saved and "saving the last completed step" not in err


def test_another_rank_exits_once_rank_0_has_saved(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    script = textwrap.dedent("""
        import sys, time
        from deeppod.runtime import stop
        stop.install()
        guard = stop.StopGuard(lambda: None, rank=1, grace=20.0, checkpoint_dir=sys.argv[1])
        print("ready", flush=True)
        time.sleep(120)  # a step that will not end in time
    """)
    p = subprocess.Popen([sys.executable, "-c", script, str(folder)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert "saving the last completed step" in p.stderr.readline()  # the guard took over...
    assert p.poll() is None  # ...and waits for rank 0's checkpoint, which is not there yet
    (folder / "ckpt-000000000007.pt").write_bytes(b"x")
    assert p.wait(timeout=30) == EXIT_RESUME


STRAGGLER = textwrap.dedent("""
    import multiprocessing, sys
    from deeppod.runtime import stop

    def loader_worker(ready, never):  # ignores SIGTERM, as DeepPod's loader workers do, and is slow to leave
        stop.loader_worker_init()
        ready.set()
        never.wait()

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("forkserver")
        ready, never = ctx.Event(), ctx.Event()
        worker = ctx.Process(target=loader_worker, args=(ready, never), daemon=True)
        worker.start()
        assert ready.wait(60)
        print(worker.pid, flush=True)
        if sys.argv[1] == "resume":
            stop.exit_for_resume()
        stop.kill_daemonic_children_at_exit()  # what a stop-safe loader registers
        sys.exit(0)
""")


@pytest.mark.parametrize("how, code", [("resume", EXIT_RESUME), ("done", 0)])
def test_a_loader_worker_left_behind_does_not_hold_the_exit(tmp_path, how, code):
    """multiprocessing's exit-time clean-up SIGTERMs its daemonic children and joins them: a
    loader worker ignores SIGTERM, so one still alive would hold the exit until the grace's
    SIGKILL (a stopped job then ends -9, not "resume me"), or for ever."""
    script = tmp_path / "straggler.py"
    script.write_text(STRAGGLER)
    p = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=60)
    assert p.returncode == code, p.stderr
    pid = int(p.stdout.split()[0])
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


NATIVE_THREAD_AT_EXIT = textwrap.dedent("""
    import atexit, sys, threading
    import torch
    from deeppod.runtime import stop

    a = torch.randn(400, 400)
    out = open(sys.argv[1], "w")
    out.write("written, never closed")
    started = threading.Event()

    def in_a_library():  # a thread inside native code (the GIL released) when the process ends
        started.set()
        while True:
            torch.mm(a, a)

    def finishing():  # a non-daemon thread: an exit waits for it
        started.wait()
        with open(sys.argv[2], "w") as f:
            f.write("finished")

    threading.Thread(target=in_a_library, daemon=True).start()
    threading.Thread(target=finishing).start()
    started.wait()
    atexit.register(lambda: print("atexit ran", flush=True))
    stop.exit_for_resume()
""")


def test_a_stop_ends_with_75_while_a_thread_is_inside_a_native_library(tmp_path):
    """The interpreter's teardown ends a thread that comes back from native code with
    pthread_exit, which C++ frames cannot unwind through: with sys.exit this process aborts
    (SIGABRT, "terminate called without an active exception") every time, as a gloo rank did at
    a stop now and then (issue 69). exit_for_resume ends the process after what an exit owes
    the job: atexit handlers, non-daemon threads, its open files flushed."""
    opened, finished = tmp_path / "opened.txt", tmp_path / "finished.txt"
    p = subprocess.run([sys.executable, "-c", NATIVE_THREAD_AT_EXIT, str(opened), str(finished)],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert p.returncode == EXIT_RESUME, p.stderr
    assert "terminate called" not in p.stderr and "Fatal Python error" not in p.stderr, p.stderr
    assert p.stdout == "atexit ran\n"
    assert opened.read_text() == "written, never closed" and finished.read_text() == "finished"

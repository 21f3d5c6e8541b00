"""Local executor: each job runs under its own supervisor process on this host."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from deeppod.contract import free_port
from deeppod.errors import ExecutorError
from deeppod.executor import usage
from deeppod.executor.base import ExecStatus, LaunchSpec, WorkerSpec
from deeppod.executor.usage import Usage
from deeppod.job_folder import JobFolder

log = logging.getLogger(__name__)


def process_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie process; None otherwise.
    Pairs with the pid so a reused pid is never mistaken for our supervisor."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def write_spec(spec: LaunchSpec) -> None:
    """The job folder for a new run: earlier runs' results gone, its spec written."""
    folder = JobFolder(spec.job_dir)
    folder.clear_run()
    folder.write_spec({
        "job_id": spec.job_id,
        "command": spec.command,
        "workdir": spec.workdir,
        "grace_seconds": spec.grace_seconds,
        "memory_mb_per_worker": spec.memory_mb_per_worker,
        "workers": [w.to_json() for w in spec.workers],
        "sandbox": spec.sandbox,
        "env": spec.env,
        "run": spec.run,
    })


def launched(job_dir: Path, run: str) -> bool:
    """Whether ``run`` of the job was launched: its spec is in the job folder (written before
    anything starts). An earlier run's spec names its own run; one written before specs named
    their run is taken as this run's, so a job an older server launched is never left unwatched."""
    try:
        return JobFolder(job_dir).read_spec().get("run", run) == run
    except (OSError, ValueError, AttributeError):
        return False


def start_detached(module: str, folder: JobFolder, what: str) -> tuple[subprocess.Popen, int | None]:
    """``python -m module JOB_DIR`` as a process of its own session (it outlives a server restart),
    its output in the job's supervisor log; the process and its start time (to know it again)."""
    out = open(folder.supervisor_log(), "ab")
    try:
        proc = subprocess.Popen([sys.executable, "-m", module, str(folder.root)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    except OSError as exc:
        raise ExecutorError(f"could not start {what}: {exc}") from exc
    finally:
        out.close()
    return proc, process_start_time(proc.pid)


class LocalExecutor:
    in_place = True
    cluster = False  # this machine is the one node
    queues = False
    names_kept = False

    def __init__(self) -> None:
        # Supervisors we started in this process, so they are reaped (no zombies).
        self._children: dict[int, subprocess.Popen] = {}

    def launch(self, spec: LaunchSpec) -> dict:
        job_dir = spec.job_dir
        write_spec(spec)
        proc, start = start_detached("deeppod.executor.supervisor", JobFolder(job_dir), "the job supervisor")
        self._children[proc.pid] = proc
        log.info("job %s: supervisor pid %s started", spec.job_id, proc.pid)
        return {"kind": "local", "job_dir": str(job_dir), "pid": proc.pid, "start_time": start}

    def find(self, job_id: int, job_dir: Path, run: str) -> dict | None:
        if not launched(job_dir, run):
            return None
        return {"kind": "local", "job_dir": str(job_dir)}  # the supervisor wrote supervisor.json there

    def _alive(self, handle: dict) -> bool:
        child = self._children.get(handle.get("pid", 0))
        if child is not None and child.poll() is not None:  # ours, and ended: reaped
            del self._children[child.pid]
            return False
        return self._pid(handle) is not None

    def poll(self, handle: dict) -> ExecStatus:
        folder = JobFolder(Path(handle["job_dir"]))
        data = folder.read_result()
        if data is not None:
            self._alive(handle)  # reap it if it is ours
            return ExecStatus(
                finished=True,
                exit_codes={int(k): int(v) for k, v in data["exit_codes"].items()},
                reason=data.get("reason", ""),
                stopped=bool(data.get("stopped")),
            )
        if self._alive(handle):
            return ExecStatus(finished=False, exit_codes=folder.exit_codes(), phase=folder.read_phase())
        if folder.read_result() is not None:  # it finished between the two looks
            return self.poll(handle)
        self._kill_strays(folder)
        return ExecStatus(finished=True, exit_codes=folder.exit_codes(), lost=True,
                          reason="the job's supervisor process died unexpectedly")

    def usage(self, handle: dict) -> Usage | None:
        pid = self._pid(handle)
        return usage.of_tree(pid) if pid is not None else None

    def _pid(self, handle: dict) -> int | None:
        """The supervisor's pid while it is the process this handle started; None after."""
        if "pid" not in handle:
            found = JobFolder(Path(handle["job_dir"])).read_supervisor()
            if not isinstance(found, dict) or "pid" not in found:
                return None
            handle = {**handle, **found}
        start = process_start_time(handle["pid"])
        return handle["pid"] if start is not None and start == handle.get("start_time") else None

    def _kill_strays(self, folder: JobFolder) -> None:
        pids = folder.read_pids()
        for pid in (pids or {}).values() if isinstance(pids, dict) else ():
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def port_on(self, node: str, address: str) -> int:
        return free_port(address)

    def add_workers(self, handle: dict, workers: list[WorkerSpec], generation: int) -> None:
        """The supervisor starts them: it watches the job folder for grow files."""
        JobFolder(Path(handle["job_dir"])).write_grow(
            generation, [w.to_json() for w in workers])

    def keep_spares(self, handle: dict, count: int) -> None:
        """The supervisor keeps that many parked (it reads them from the job folder)."""
        JobFolder(Path(handle["job_dir"])).write_spares(count)

    def terminate(self, handle: dict) -> None:
        if "pid" in handle and self._alive(handle):
            try:
                os.kill(handle["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass

"""Local executor: each job runs under its own supervisor process on this host."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from deeppod.contract import SPARES_FILE, free_port
from deeppod.errors import ExecutorError
from deeppod.executor.base import ExecStatus, LaunchSpec, WorkerSpec

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


def read_exit_codes(job_dir: Path) -> dict[int, int]:
    codes = {}
    exit_dir = job_dir / "exit"
    if exit_dir.is_dir():
        for f in exit_dir.glob("rank-*"):
            try:
                codes[int(f.name.split("-", 1)[1])] = int(f.read_text().strip())
            except ValueError:
                continue
    return codes


def write_spec(spec: LaunchSpec) -> None:
    """The job folder for a new run: earlier runs' results gone, ``spec.json`` written (it
    holds the job's API token: readable by the server only)."""
    job_dir = spec.job_dir
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "logs").mkdir(exist_ok=True)
    for stale in ("result.json", "workers.json", "supervisor.json"):
        (job_dir / stale).unlink(missing_ok=True)
    for f in (job_dir / "exit").glob("rank-*") if (job_dir / "exit").is_dir() else []:
        f.unlink()
    for f in job_dir.glob("grow-*.json"):  # an earlier run's in-place grows
        f.unlink()
    fd = os.open(job_dir / "spec.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({
            "job_id": spec.job_id,
            "command": spec.command,
            "workdir": spec.workdir,
            "grace_seconds": spec.grace_seconds,
            "memory_mb_per_worker": spec.memory_mb_per_worker,
            "workers": [{"rank": w.rank, "node": w.node, "env": w.env} for w in spec.workers],
            "sandbox": spec.sandbox,
        }, f)


def grow_file(job_dir: Path, generation: int) -> Path:
    """Where the control plane leaves workers for a running job's supervisor to start."""
    return job_dir / f"grow-{generation}.json"


class LocalExecutor:
    in_place = True

    def __init__(self) -> None:
        # Supervisors we started in this process, so they are reaped (no zombies).
        self._children: dict[int, subprocess.Popen] = {}

    def launch(self, spec: LaunchSpec) -> dict:
        job_dir = spec.job_dir
        write_spec(spec)
        out = open(job_dir / "supervisor.log", "ab")
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "deeppod.executor.supervisor", str(job_dir)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )
        except OSError as exc:
            raise ExecutorError(f"could not start the job supervisor: {exc}") from exc
        finally:
            out.close()
        self._children[proc.pid] = proc
        start = process_start_time(proc.pid)
        log.info("job %s: supervisor pid %s started", spec.job_id, proc.pid)
        return {"kind": "local", "job_dir": str(job_dir), "pid": proc.pid, "start_time": start}

    def find(self, job_id: int, job_dir: Path) -> dict:
        return {"kind": "local", "job_dir": str(job_dir)}  # the supervisor wrote supervisor.json there

    def _alive(self, handle: dict) -> bool:
        if "pid" not in handle:
            try:
                handle = {**handle, **json.loads((Path(handle["job_dir"]) / "supervisor.json").read_text())}
            except (OSError, ValueError):
                return False
        pid = handle["pid"]
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            del self._children[pid]
            return False
        start = process_start_time(pid)
        return start is not None and start == handle.get("start_time")

    def poll(self, handle: dict) -> ExecStatus:
        job_dir = Path(handle["job_dir"])
        result = job_dir / "result.json"
        if result.exists():
            self._alive(handle)  # reap it if it is ours
            data = json.loads(result.read_text())
            return ExecStatus(
                finished=True,
                exit_codes={int(k): int(v) for k, v in data["exit_codes"].items()},
                reason=data.get("reason", ""),
                stopped=bool(data.get("stopped")),
            )
        if self._alive(handle):
            return ExecStatus(finished=False, exit_codes=read_exit_codes(job_dir))
        if result.exists():  # it finished between the two looks
            return self.poll(handle)
        self._kill_strays(job_dir)
        return ExecStatus(finished=True, exit_codes=read_exit_codes(job_dir), lost=True,
                          reason="the job's supervisor process died unexpectedly")

    def _kill_strays(self, job_dir: Path) -> None:
        try:
            pids = json.loads((job_dir / "workers.json").read_text())
        except (OSError, ValueError):
            return
        for pid in pids.values():
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def port_on(self, node: str, address: str) -> int:
        return free_port(address)

    def add_workers(self, handle: dict, workers: list[WorkerSpec], generation: int) -> None:
        """The supervisor starts them: it watches the job folder for grow files."""
        path = grow_file(Path(handle["job_dir"]), generation)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the job's token
        with os.fdopen(fd, "w") as f:
            json.dump({"workers": [{"rank": w.rank, "node": w.node, "env": w.env} for w in workers]}, f)
        os.replace(tmp, path)

    def keep_spares(self, handle: dict, count: int) -> None:
        """The supervisor keeps that many parked (it reads the job folder's SPARES_FILE)."""
        path = Path(handle["job_dir"]) / SPARES_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"count": int(count)}))
        os.replace(tmp, path)

    def terminate(self, handle: dict) -> None:
        if "pid" in handle and self._alive(handle):
            try:
                os.kill(handle["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass

"""An in-memory executor for tests of the control plane: no processes."""

from __future__ import annotations

from pathlib import Path

from deeppod.executor.base import ExecStatus, LaunchSpec, WorkerSpec
from deeppod.executor.usage import Usage


class FakeExecutor:
    in_place = True
    cluster = False
    queues = False
    names_kept = False

    def __init__(self) -> None:
        self.added: dict[int, list[tuple[int, list[WorkerSpec]]]] = {}  # job -> [(generation, workers)]
        self.launched: dict[int, LaunchSpec] = {}
        self.status: dict[int, ExecStatus] = {}
        self.terminated: list[int] = []
        self.spares: dict[int, int] = {}  # job -> warm spares asked for
        self.used: dict[int, Usage] = {}  # job -> what usage() answers (a test sets it)

    def launch(self, spec: LaunchSpec) -> dict:
        self.launched[spec.job_id] = spec
        self.status[spec.job_id] = ExecStatus(finished=False)
        return {"kind": "fake", "job_id": spec.job_id}

    def find(self, job_id: int, job_dir: Path, run: str) -> dict | None:
        spec = self.launched.get(job_id)
        return {"kind": "fake", "job_id": job_id} if spec is not None and spec.run == run else None

    def poll(self, handle: dict) -> ExecStatus:
        return self.status.get(handle["job_id"], ExecStatus(finished=True, lost=True, reason="never launched"))

    def terminate(self, handle: dict) -> None:
        job_id = handle["job_id"]
        self.terminated.append(job_id)
        self.status[job_id] = ExecStatus(finished=True, exit_codes={}, reason="stop requested", stopped=True)

    def port_on(self, node: str, address: str) -> int:
        return 29500

    def add_workers(self, handle: dict, workers: list[WorkerSpec], generation: int) -> None:
        self.added.setdefault(handle["job_id"], []).append((generation, list(workers)))

    def keep_spares(self, handle: dict, count: int) -> None:
        self.spares[handle["job_id"]] = count

    def usage(self, handle: dict) -> Usage | None:
        return self.used.get(handle["job_id"])

    # test helpers
    def finish(self, job_id: int, exit_codes: dict[int, int], reason: str = "") -> None:
        self.status[job_id] = ExecStatus(finished=True, exit_codes=exit_codes, reason=reason)

"""An executor whose every action first checks the fencing token: only the leader acts.

With two servers on one database (a failover control plane), a leader that was paused or cut
off may come back after a standby took over. Its launches and stops are refused here
(``NotLeader``) once the lease names another server or a later epoch (cluster/leader.py).
Reading (poll, find) is harmless and passes through.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from deeppod.executor.base import ExecStatus, Executor, LaunchSpec, WorkerSpec


class FencedExecutor:
    def __init__(self, inner: Executor, check: Callable[[], None]):
        self.inner = inner
        self.check = check  # raises NotLeader unless this server leads at its epoch

    def launch(self, spec: LaunchSpec) -> dict:
        self.check()
        return self.inner.launch(spec)

    def terminate(self, handle: dict) -> None:
        self.check()
        self.inner.terminate(handle)

    def add_workers(self, handle: dict, workers: list[WorkerSpec], generation: int) -> None:
        self.check()
        self.inner.add_workers(handle, workers, generation)

    def keep_spares(self, handle: dict, count: int) -> None:
        self.check()
        self.inner.keep_spares(handle, count)

    @property
    def in_place(self) -> bool:
        return self.inner.in_place

    @property
    def cluster(self) -> bool:
        return self.inner.cluster

    @property
    def queues(self) -> bool:
        return self.inner.queues

    @property
    def names_kept(self) -> bool:
        return self.inner.names_kept

    def find(self, job_id: int, job_dir: Path, run: str) -> dict | None:
        return self.inner.find(job_id, job_dir, run)

    def poll(self, handle: dict) -> ExecStatus:
        return self.inner.poll(handle)

    def port_on(self, node: str, address: str) -> int:
        return self.inner.port_on(node, address)

    def __getattr__(self, name: str):  # nodes(), and what tests read from a fake
        return getattr(self.inner, name)

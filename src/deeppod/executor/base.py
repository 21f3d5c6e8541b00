"""The executor interface and the values that cross it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    node: str
    env: dict[str, str]
    # the CPUs the server offers on its node (None: not known): more than the node's cores means
    # jobs that each fit may still outnumber them together (executor/affinity.quiet_threads)
    node_cpus: int | None = None

    def to_json(self) -> dict:
        """As the job folder's spec and grow files hold it."""
        return {"rank": self.rank, "node": self.node, "env": self.env, "node_cpus": self.node_cpus}


@dataclass(frozen=True)
class LaunchSpec:
    job_id: int
    job_dir: Path
    command: list[str]
    workdir: str
    workers: list[WorkerSpec]
    grace_seconds: float = 30.0
    memory_mb_per_worker: int | None = None
    # run each worker in a sandbox as another OS identity (executor/sandbox.py):
    # {"uid", "gid", "workdir", "python": [read-only paths], "binds": [[src, dst, writable]]}
    sandbox: dict | None = None
    # its own Python environment (envs/build.py): built or found by the supervisor before the workers start
    env: dict | None = None
    # which run of the job this is (jobs/runs.run_mark): a restarted server tells a run that was
    # launched before it died from one that was only decided on (find())
    run: str = ""
    # what each worker asked for: an executor that allocates (Slurm) asks for exactly this
    gpus_per_worker: int = 0
    cpus_per_worker: float = 1.0
    # where a cluster's own scheduler files it (Slurm's --account and --qos: the plan's slurm_account
    # and slurm_qos for its tenant); None: that scheduler's default for the job's user
    account: str | None = None
    qos: str | None = None
    # the longest this run may last (the job's --time): an executor that queues (Slurm) enforces it
    # itself; for the others the controller stops the job at its end (jobs/time_limit.py)
    time_limit_seconds: float | None = None


@dataclass(frozen=True)
class ExecStatus:
    """What the executor knows about a launched job."""

    finished: bool
    exit_codes: dict[int, int] = field(default_factory=dict)
    reason: str = ""  # why it ended early (a worker failed, memory limit, stop requested)
    stopped: bool = False  # ended because terminate() asked it to
    lost: bool = False  # the supervisor vanished without a result
    lost_nodes: tuple[str, ...] = ()  # nodes that left the cluster under it: not the job's fault, requeued
    phase: str = ""  # what it does before its workers start ("preparing environment"); "": nothing
    timed_out: bool = False  # its cluster's scheduler ended it at its time limit (Slurm's TIMEOUT)
    # where its cluster's scheduler put each worker, (rank, node, GPUs), for one that places them itself (Slurm)
    placed: tuple[tuple[int, str, tuple[int, ...]], ...] = ()


class Executor(Protocol):
    """What the control plane runs jobs with. Capabilities are declared, not probed: ``in_place``
    (a running job's workers can be added to and leave), ``cluster`` (its nodes come and
    go: ``nodes()`` lists them and ``samplers()`` reads their monitoring; else this machine is
    the one node) and ``queues`` (its cluster has a scheduler of its own, which queues and places
    what it is handed: DeepPod's round only hands jobs off, scheduler/phases/hand_off.py) and
    ``names_kept`` (a cluster node's name is for good: one that was down and is up again is
    taken back; a Ray node that comes back is a new node)."""

    in_place: bool
    cluster: bool
    queues: bool
    names_kept: bool

    def launch(self, spec: LaunchSpec) -> dict:
        """Start the workers; return a JSON-able handle that finds them again after a restart."""

    def find(self, job_id: int, job_dir: Path, run: str) -> dict | None:
        """A handle for a launch of ``run`` whose own handle was never recorded (the server
        stopped between starting the workers and committing): enough to poll and terminate it.
        None when no launch of that run is on record: the server stopped after deciding to start
        it and before launching it."""

    def poll(self, handle: dict) -> ExecStatus: ...

    def terminate(self, handle: dict) -> None:
        """Ask every worker to stop: SIGTERM, the job's grace period, then SIGKILL. Idempotent."""

    def port_on(self, node: str, address: str) -> int:
        """A TCP port free now on ``node`` (at ``address``): rank 0's MASTER_PORT."""

    def add_workers(self, handle: dict, workers: list[WorkerSpec], generation: int) -> None:
        """Start more workers in a running job (an in-place grow); the job's workers that are
        running go on. Only where ``in_place`` is true."""

    def keep_spares(self, handle: dict, count: int) -> None:
        """Keep ``count`` warm spares of a running job (runtime/spare.py): an in-place grow
        hands them the new workers' places. Only where ``in_place`` is true."""

    def usage(self, handle: dict):
        """What a running job's processes use now (``executor/usage.Usage``: CPU seconds so far,
        resident memory); None where the executor cannot see them (Ray nodes) or they ended."""

    def nodes(self) -> list:
        """The cluster's nodes now (``cluster/inventory.NodeInfo``). Only where ``cluster`` is true."""

    def samplers(self):
        """Every node's monitoring readings (``cluster/readings``). Only where ``cluster`` is true."""

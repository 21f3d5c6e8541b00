"""The values a scheduling round reads (a snapshot) and returns (decisions)."""

from __future__ import annotations

from dataclasses import dataclass, field

from deeppod.scheduler.plan import Plan
from deeppod.scheduler.topology import Topology


@dataclass(frozen=True)
class NodeState:
    name: str
    free_gpus: tuple[int, ...]  # healthy GPU indices not allocated to any running job
    free_cpus: float
    free_memory_mb: int
    healthy: bool = True
    total_gpus: int | None = None  # healthy GPUs on the node, free or not (default: the free ones)
    sick_gpus: tuple[int, ...] = ()  # cordoned or failed GPUs: jobs on them are requeued
    topology: Topology | None = None  # how its GPUs are linked (topology.py); None: all alike
    gpu_memory_mb: int = 0  # the least memory of its healthy GPUs; 0: not known (logical slots), any job fits
    burst: str | None = None  # a burst node's type (burst.py); None: one of the cluster's own


@dataclass(frozen=True)
class PendingJob:
    id: int
    tenant: str
    workers: int  # min workers: the gang that must start together
    gpus_per_worker: int = 0
    cpus_per_worker: float = 1.0
    memory_mb_per_worker: int = 0
    priority: int = 0
    submitted_at: float = 0.0
    max_workers: int | None = None  # elastic when above ``workers``
    preemptible: bool = True
    resize_to: int | None = None  # the size a shrink or grow asked for
    avoid: frozenset[tuple[str, int]] = frozenset()  # (node, gpu) where it last failed
    attained: float = 0.0  # GPU-seconds it has run so far (earlier runs): its service class
    queued_at: float | None = None  # when it last entered the queue (default: submitted_at)
    gpu_memory_mb: int = 0  # the memory each of its GPUs must have; 0: any

    @property
    def min_workers(self) -> int:
        return self.workers

    @property
    def top_workers(self) -> int:
        return max(self.workers, self.max_workers or self.workers)


@dataclass(frozen=True)
class WorkerPlacement:
    rank: int
    node: str
    gpus: tuple[int, ...]
    cpus: float
    memory_mb: int


@dataclass(frozen=True)
class RunningJob:
    id: int
    tenant: str
    placement: tuple[WorkerPlacement, ...]
    gpus_per_worker: int = 0
    min_workers: int = 1
    max_workers: int = 1
    priority: int = 0
    preemptible: bool = True
    started_at: float = 0.0
    last_checkpoint_at: float | None = None
    stopping: bool = False  # already being preempted or resized: its GPUs are on their way back
    # a search trial, or a job idle on its GPUs when the plan says so: the first to give GPUs back
    reclaim_first: bool = False
    attained: float = 0.0  # GPU-seconds run so far, this run included
    in_place: bool = False  # it uses deeppod.runtime: a resize re-forms its group without a restart
    # None: ``attained`` is as of the snapshot. A time: ``attained`` is as of then, and the job
    # adds its GPUs' worth every second since (a caller that keeps its rows from one round to
    # the next need not make a new one each round: the simulator)
    attained_since: float | None = None
    gpu_memory_mb: int = 0  # what each of its GPUs must have (a grow places new workers on such GPUs only)

    @property
    def workers(self) -> int:
        return len(self.placement)

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker


def attained_at(job: RunningJob, now: float) -> float:
    """``job``'s attained service (GPU-seconds) at ``now``."""
    if job.attained_since is None:
        return job.attained
    return job.attained + max(0.0, now - job.attained_since) * len(job.placement) * job.gpus_per_worker


@dataclass(frozen=True)
class Config:
    # every this long in the queue adds 1 to a job's priority, up to the highest priority
    # waiting in its tenant's queue (aging lifts a job to the top class, never past it)
    aging_seconds: float = 600.0
    reserve_after_seconds: float = 300.0  # a blocked head job this old gets a reservation
    min_run_before_resize: float = 900.0  # no grow/shrink of a job younger than this (anti-thrash)
    grow: bool = True
    priority_preemption: bool = True
    # Least attained service (Tiresias): a job's class is how many of these GPU-second
    # thresholds its attained service has passed; within a priority, lower classes go first
    # and may preempt (or shrink) jobs of higher classes of the same tenant, or jobs that
    # borrow another tenant's GPUs.
    las_thresholds: tuple[float, ...] = (2 * 3600.0, 32 * 3600.0)
    las_preemption: bool = True
    # also take borrowed GPUs from another tenant's higher classes (never below its
    # guarantee), while the waiting job's tenant is within its share (docs/scheduler.md)
    las_across_tenants: bool = True
    # a job that has waited starve_factor x its attained run time (at least starve_after
    # seconds) since it was last queued is treated as class 0 again: nobody waits forever
    starve_factor: float = 1.0
    starve_after: float = 1800.0
    # what a resize costs, seconds: in place (deeppod.runtime re-forms the group) or by
    # checkpoint restart; the anti-thrash window is resize_window_factor times that cost
    resize_cost_in_place: float = 5.0
    resize_cost_restart: float = 30.0
    resize_window_factor: float = 30.0
    # a round makes room for up to this many of a tenant's waiting jobs of the first one's
    # class at once, not only the first: a burst of short jobs then waits one stop delay,
    # not one round per job (1: the first job only)
    las_jobs_per_round: int = 64
    min_run_before_las_preempt: float = 900.0  # a run this young is not preempted for a lower class
    # a gang a tenant below its guarantee waits for, when no node can be cleared by evicting
    # jobs that borrow, gets whole nodes by also moving the jobs that run within a guarantee
    # onto free GPUs elsewhere (checkpoint and restart: their tenants keep their GPUs); the
    # nodes it gets are held for it, not only counted (docs/scheduler.md)
    defragment: bool = True
    # reclaim earmarks free GPUs for all of a tenant's 1-GPU-per-worker jobs that fit in its
    # guarantee before its one eviction of the round; False: one job a round (the Philly
    # benchmark's `before` run)
    earmark_free: bool = True
    # the round's phases, in order, by name (scheduler/phases/); one left out does not run.
    # grow, priority_preemption and las_preemption above turn theirs off too
    phases: tuple[str, ...] = ("health", "candidates", "reclaim", "fair_share", "priority", "least_attained",
                               "starts", "grow")

    def resize_window(self, in_place: bool) -> float:
        """How long a job runs at a size before it may be resized again."""
        if not in_place:
            return self.min_run_before_resize
        return min(self.min_run_before_resize, self.resize_cost_in_place * self.resize_window_factor)


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeState, ...]
    queued: tuple[PendingJob, ...] = field(default_factory=tuple)
    running: tuple[RunningJob, ...] = field(default_factory=tuple)
    plan: Plan = field(default_factory=Plan)
    now: float = 0.0
    config: Config = field(default_factory=Config)


# -- decisions -------------------------------------------------------------------

@dataclass(frozen=True)
class Start:
    job_id: int
    placement: tuple[WorkerPlacement, ...]
    reason: str = ""


@dataclass(frozen=True)
class Preempt:
    job_id: int
    reason: str


@dataclass(frozen=True)
class Resize:
    """Change the job to ``workers`` (shrink or grow). A job that resizes in place keeps its
    processes; a grow in place names where the new workers go (``added``, ranks from the
    old size up). Otherwise the job is stopped gracefully and started again at the new size."""

    job_id: int
    workers: int
    reason: str
    in_place: bool = False
    added: tuple[WorkerPlacement, ...] = ()


@dataclass(frozen=True)
class Wait:
    job_id: int
    reason: str


@dataclass
class Decisions:
    starts: list[Start] = field(default_factory=list)
    preempts: list[Preempt] = field(default_factory=list)
    resizes: list[Resize] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)

    def __iter__(self):
        yield from self.preempts
        yield from self.resizes
        yield from self.starts

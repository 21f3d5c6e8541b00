"""What a job holds while it runs: its placed workers, the datasets staged for it, its warm
spares and an in-place resize under way. The typed form of the ``jobs.allocation`` JSON
column, with its one (de)serializer (the API shows the JSON as it is)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from deeppod.scheduler import WorkerPlacement
from deeppod.store.models import Job


def worker_from_json(d: dict) -> WorkerPlacement:
    """One worker of the current run as stored: where it runs and what it holds."""
    return WorkerPlacement(int(d["rank"]), d["node"], tuple(d["gpus"]), d["cpus"], d.get("memory_mb") or 0)


def worker_to_json(w: WorkerPlacement) -> dict:
    return {"rank": w.rank, "node": w.node, "gpus": list(w.gpus), "cpus": w.cpus, "memory_mb": w.memory_mb}


@dataclass(frozen=True)
class PendingResize:
    """An in-place resize decided and not yet done (jobs/resize.py). ``world``: on a grow, the
    world the running workers are told once the joiners are ready (None once told)."""

    generation: int
    before: int  # workers before the resize
    to: int
    decided_at: float
    world: dict | None = None
    joiners: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, d: dict) -> PendingResize:
        return cls(int(d["generation"]), int(d["from"]), int(d["to"]), float(d["decided_at"]), d.get("world"),
                   tuple(d.get("joiners") or ()))

    def to_json(self) -> dict:
        out = {"generation": self.generation, "from": self.before, "to": self.to, "decided_at": self.decided_at}
        if self.world is not None:
            out["world"] = self.world
        if self.joiners:
            out["joiners"] = list(self.joiners)
        return out


@dataclass
class Allocation:
    workers: list[WorkerPlacement] = field(default_factory=list)
    staged: dict[str, str] = field(default_factory=dict)  # dataset env var -> its staged folder
    generation: int = 0  # of the job's world: one more per in-place resize
    resize: PendingResize | None = None
    spares: int | None = 0  # warm spares kept; None: to be worked out again (the executor is told)

    @classmethod
    def of(cls, job: Job) -> Allocation:
        d = job.allocation or {}
        return cls(workers=[worker_from_json(w) for w in d.get("workers", [])], staged=dict(d.get("staged") or {}),
                   generation=int(d.get("generation", 0)),
                   resize=PendingResize.from_json(d["resize"]) if d.get("resize") else None,
                   spares=d.get("spares", 0))

    def to_json(self) -> dict:
        out: dict = {"workers": [worker_to_json(w) for w in self.workers], "staged": self.staged, "spares": self.spares}
        if self.generation:
            out["generation"] = self.generation
        if self.resize is not None:
            out["resize"] = self.resize.to_json()
        return out

    def place(self, placed: tuple[tuple[int, str, tuple[int, ...]], ...]) -> bool:
        """Where a cluster that places workers itself (Slurm) put them, as (rank, node, GPUs):
        whether that changed anything."""
        at = {rank: (node, gpus) for rank, node, gpus in placed}
        workers = [replace(w, node=at[w.rank][0], gpus=at[w.rank][1]) if w.rank in at else w for w in self.workers]
        changed, self.workers = workers != self.workers, workers
        return changed

    def save(self, job: Job) -> None:
        job.allocation = self.to_json()

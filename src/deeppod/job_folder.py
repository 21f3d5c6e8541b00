"""The job folder protocol: every file the control plane, the executors, the per-job
supervisor and the sandbox exchange about one job, and how each is read and written.

``JOBS_DIR/<id>/``::

    spec.json            the run's workers, command and sandbox (0600: it holds the job's token)
    supervisor.json      the supervisor's pid and start time (a restarted server finds it)
    phase                what the supervisor does before the workers start (preparing environment)
    supervisor[-N].log   the supervisor's own output (N: a node's part of a cluster job)
    workers[-N].json     the workers' pids (a vanished supervisor's strays are killed by them)
    result[-N].json      how the run ended: exit codes, reason, whether a stop was asked
    exit/rank-R          worker R's exit code, as it happens
    exit/oom-R           the memory limit (MiB) worker R went over, when the kernel killed it
    exit/node-R          on Slurm: the node and GPUs Slurm gave worker R (its task's word, checked against Slurm's)
    logs/rank-R.log      worker R's output; logs/rank-R.marks: its size stamped with the time
    logs/spare-N.log     warm spare N's output until it becomes a worker
    grow-G.json          in-place grow G: the workers the supervisor starts
    spares.json          {"count": N}: how many warm spares the supervisor keeps parked
    stop                 on a cluster: "stop", or why every node's part stops
    shared-check         on a cluster: a nonce each node reads back (the folder is shared)
    world/world.json     the control plane's word on the job's world (read-only to the job)
    code/                the code sent with the job (its workdir)
    checkpoints/ model/ outputs/ tensorboard/   the job's own to write
    .sandbox-NAME/       the empty folder a sandbox's root is mounted on
    slurm-spec.json      on Slurm: what the job's tasks start (the job's own copy; it holds its token)
    slurm-batch.sh/.log  on Slurm: the batch script DeepPod submits, and its output
    slurm-submit.json    on Slurm, for a job with its own environment: the sbatch line submitted once it is built
    slurm-id             on Slurm: the job id sbatch gave it, when submitted after its environment was built

What the job itself writes into its checkpoint folder (marks, acknowledgements) is named in
``deeppod.contract``. Standard library only: the supervisor and the sandbox use it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from deeppod.atomic import atomic_json, atomic_write
from deeppod.contract import JOINER_READY, RESIZABLE_MARK, RESTART_MARK, SPARE_PARKED, WORLD_ACK
from deeppod.nofollow import read_small

CHECKPOINTS, MODEL, OUTPUTS, TENSORBOARD, CODE = "checkpoints", "model", "outputs", "tensorboard", "code"
WRITABLE = (CHECKPOINTS, MODEL, OUTPUTS, TENSORBOARD)  # of its folder: the job's to write
WORLD = "world"
_ACK_MAX_BYTES = 4096


def _part(name: str, part: int | None) -> str:
    return f"{name}.json" if part is None else f"{name}-{part}.json"


@dataclass(frozen=True)
class JobFolder:
    root: Path

    @classmethod
    def of(cls, jobs_dir: Path | str, job_id: int) -> JobFolder:
        return cls(Path(jobs_dir) / str(job_id))

    # folders ---------------------------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def model(self) -> Path:
        return self.root / MODEL

    @property
    def outputs(self) -> Path:
        return self.root / OUTPUTS

    @property
    def evaluation(self) -> Path:
        """What a model comparison job writes (in outputs/: its to write)."""
        return self.outputs / "evaluation.json"

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD

    @property
    def code(self) -> Path:
        return self.root / CODE

    @property
    def world_dir(self) -> Path:
        return self.root / WORLD

    @property
    def world_file(self) -> Path:
        return self.world_dir / "world.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def exits(self) -> Path:
        return self.root / "exit"

    def log(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    def marks(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.marks"

    def stamp_log(self, rank: int, stamped: int) -> int:
        """Stamp rank ``rank``'s log size with the time if it grew past ``stamped`` ('deeppod logs'
        interleaves ranks by these); the size stamped now."""
        try:
            size = self.log(rank).stat().st_size
            if size > stamped:
                with open(self.marks(rank), "a") as f:
                    f.write(f"{size} {time.time():.3f}\n")
            return max(size, stamped)
        except OSError:
            return stamped

    def rank_logs(self) -> dict[int, Path]:
        """Every worker's log there is, by rank."""
        found = {}
        for f in self.logs.glob("rank-*.log"):
            try:
                found[int(f.stem.split("-", 1)[1])] = f
            except ValueError:
                continue
        return found

    def spare_log(self, n: int) -> Path:
        return self.logs / f"spare-{n}.log"

    def exit_file(self, rank: int) -> Path:
        return self.exits / f"rank-{rank}"

    def node_file(self, rank: int) -> Path:
        return self.exits / f"node-{rank}"

    def result_file(self) -> Path:
        return self.root / _part("result", None)

    def slurm_spec(self) -> Path:
        return self.root / "slurm-spec.json"

    def slurm_batch(self, suffix: str) -> Path:
        """The batch script (``sh``) or its output (``log``)."""
        return self.root / f"slurm-batch.{suffix}"

    def slurm_submit(self) -> Path:
        return self.root / "slurm-submit.json"

    def write_slurm_id(self, slurm_id: str) -> None:
        atomic_write(self.root / "slurm-id", slurm_id, mode=0o600)

    def read_slurm_id(self) -> str | None:
        try:
            return (self.root / "slurm-id").read_text().strip() or None
        except OSError:
            return None

    def supervisor_log(self, part: int | None = None) -> Path:
        return self.root / ("supervisor.log" if part is None else f"supervisor-{part}.log")

    def sandbox_root(self, name: str) -> Path:
        return self.root / f".sandbox-{name}"

    # a new run -------------------------------------------------------------------------
    def clear_run(self) -> None:
        """Ready for a new run: the folder and its logs there, earlier runs' results, exits,
        grows, stop word and node parts gone."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        for name in ("result.json", "workers.json", "supervisor.json", "stop", "phase", "slurm-id"):
            (self.root / name).unlink(missing_ok=True)
        for pattern in ("result-*.json", "grow-*.json"):
            for f in self.root.glob(pattern):
                f.unlink()
        if self.exits.is_dir():
            for pattern in ("rank-*", "oom-*", "node-*"):
                for f in self.exits.glob(pattern):
                    f.unlink()

    def write_spec(self, spec: dict) -> None:
        atomic_json(self.root / "spec.json", spec)  # private: it holds the job's token

    def read_spec(self) -> dict:
        return json.loads((self.root / "spec.json").read_text())

    # the supervisor's side -------------------------------------------------------------
    def write_supervisor(self, pid: int, start_time: int) -> None:
        atomic_json(self.root / "supervisor.json", {"pid": pid, "start_time": start_time}, fsync=True)

    def read_supervisor(self) -> dict | None:
        return _read_json(self.root / "supervisor.json")

    def write_pids(self, pids: dict[str, int], part: int | None = None) -> None:
        atomic_json(self.root / _part("workers", part), pids, fsync=True)

    def read_pids(self, part: int | None = None) -> dict | None:
        return _read_json(self.root / _part("workers", part))

    def record_exit(self, rank: int, code: int) -> None:
        self.exits.mkdir(exist_ok=True)
        (self.exits / f"rank-{rank}").write_text(str(code))

    def record_oom(self, name: str, limit_mb: int | None) -> None:
        """The kernel killed worker ``name`` (a rank, or spare-N) for going over its memory limit."""
        self.exits.mkdir(exist_ok=True)
        (self.exits / f"oom-{name}").write_text(str(limit_mb or 0))

    def oom_limit(self, rank: int) -> int | None:
        """The memory limit (MiB) rank ``rank`` ran out of; None if it did not (0: no limit known)."""
        try:
            return int((self.exits / f"oom-{rank}").read_text())
        except (OSError, ValueError):
            return None

    def exit_codes(self) -> dict[int, int]:
        codes = {}
        if self.exits.is_dir():
            for f in self.exits.glob("rank-*"):
                try:
                    codes[int(f.name.split("-", 1)[1])] = int(f.read_text().strip())
                except ValueError:
                    continue
        return codes

    def write_result(self, result: dict, part: int | None = None) -> None:
        atomic_json(self.root / _part("result", part), result, fsync=True)

    def read_result(self, part: int | None = None) -> dict | None:
        """How the run (or a node's part of it) ended; None while it has not."""
        return _read_json(self.root / _part("result", part))

    def write_phase(self, phase: str | None) -> None:
        """What the supervisor does before the workers start ("preparing environment"); None: done."""
        if phase is None:
            (self.root / "phase").unlink(missing_ok=True)
        else:
            atomic_write(self.root / "phase", phase, mode=0o644)

    def read_phase(self) -> str:
        try:
            return (self.root / "phase").read_text().strip()
        except OSError:
            return ""

    # in-place grows and warm spares ----------------------------------------------------
    def write_grow(self, generation: int, workers: list[dict]) -> None:
        atomic_json(self.root / f"grow-{generation}.json", {"workers": workers})  # private: tokens

    def grows(self) -> list[Path]:
        return sorted(self.root.glob("grow-*.json"))

    @staticmethod
    def read_grow(path: Path) -> list[dict]:
        """A grow file's workers; OSError, ValueError or KeyError when it cannot be read."""
        return json.loads(path.read_text())["workers"]

    def write_spares(self, count: int) -> None:
        atomic_json(self.root / "spares.json", {"count": int(count)})

    def spares_changed_at(self) -> int | None:
        try:
            return (self.root / "spares.json").stat().st_mtime_ns
        except OSError:
            return None

    def read_spares(self) -> int:
        doc = _read_json(self.root / "spares.json")
        try:
            return max(0, int(doc["count"]))
        except (TypeError, KeyError, ValueError):
            return 0

    # a cluster job's nodes -------------------------------------------------------------
    def ask_stop(self, why: str) -> None:
        """Every node's part stops: "stop" (asked for) or why (the first word stays)."""
        if not (self.root / "stop").exists():
            atomic_write(self.root / "stop", why, mode=0o644)

    def read_stop(self) -> str | None:
        try:
            return (self.root / "stop").read_text().strip()
        except OSError:
            return None

    def write_shared_check(self, nonce: str) -> None:
        (self.root / "shared-check").write_text(nonce)

    def read_shared_check(self) -> str | None:
        try:
            return (self.root / "shared-check").read_text()
        except OSError:
            return None

    # the world of an in-place resize (jobs/resize.py, runtime/resize.py) ---------------
    def write_world(self, world: dict) -> None:
        atomic_json(self.world_file, world, mode=0o644)  # the job reads it (bound read-only)

    def reset_world(self) -> None:
        """A new run starts at generation 0: no world file, no mark or answer from the last run."""
        self.world_dir.mkdir(exist_ok=True)
        self.world_file.unlink(missing_ok=True)
        for name in (RESIZABLE_MARK, RESTART_MARK, WORLD_ACK):
            (self.checkpoints / name).unlink(missing_ok=True)
        for pattern in (JOINER_READY.format(rank="*"), SPARE_PARKED.format(n="*")):
            for mark in self.checkpoints.glob(pattern):
                mark.unlink(missing_ok=True)

    # what the job says in its checkpoint folder (a folder it owns: no link is followed) -
    def resizable(self) -> bool:
        """The job's rank 0 said it can resize in place (it made a ``runtime.Resizer``)."""
        return os.path.lexists(self.checkpoints / RESIZABLE_MARK)

    def restart_reason(self) -> str:
        """Why the job said it resizes by a restart, not in place ("" when it did not say)."""
        raw = read_small(self.checkpoints / RESTART_MARK, 512)
        return "" if raw is None else raw.decode(errors="replace").strip().replace("\n", " ")[:300]

    def joiners_ready(self, ranks) -> bool:
        """Every new worker of a grow has built its model and waits for the others."""
        return all(os.path.lexists(self.checkpoints / JOINER_READY.format(rank=r)) for r in ranks)

    def clear_ready(self, ranks) -> None:
        for r in ranks:
            (self.checkpoints / JOINER_READY.format(rank=r)).unlink(missing_ok=True)

    def read_ack(self) -> dict | None:
        """The job's answer to a resize: small, a dict with a generation, or nothing."""
        try:
            fd = os.open(self.checkpoints / WORLD_ACK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            data = os.read(fd, _ACK_MAX_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > _ACK_MAX_BYTES:
            return None
        try:
            ack = json.loads(data)
        except ValueError:
            return None
        return ack if isinstance(ack, dict) and isinstance(ack.get("generation"), int) else None


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

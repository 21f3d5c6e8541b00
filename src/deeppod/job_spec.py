"""What a job asks for, declared once for client and server (standard library only): each field
with its type, default, bounds and description. The API's request body (``JobCreate``) is built
from it, the service takes it, the SDK builds it, and tests hold the CLI's options and the
console's form to it, so a new job option is written here first."""

from __future__ import annotations

import difflib
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Literal

from deeppod.errors import InvalidRequest


def _opt(default: Any = None, *, factory=None, description: str = "", **bounds) -> Any:
    """A field: its default (or ``factory``), and what the API checks of it (pydantic's names:
    ge, gt, le, min_length, max_length, pattern) and says of it."""
    meta = {**bounds, **({"description": description} if description else {})}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class JobSpec:
    command: list[str] = field(metadata={"min_length": 1,
                                         "description": "argv of every worker, e.g. ['python', 'train.py']"})
    workdir: str | None = _opt(max_length=4096, description="absolute working directory on the server host; left "
                               "out, the job works in a folder of its own holding its 'code' (or nothing)")
    code: str | None = _opt(pattern="^[0-9a-f]{64}$", description="digest of the job's code sent with PUT "
                            "/v1/code/DIGEST")
    name: str | None = _opt(max_length=128)
    workers: int = _opt(1, ge=1, le=4096, description="workers that start together (the minimum)")
    max_workers: int | None = _opt(ge=1, le=4096, description="elastic: grow up to this many")
    gpus_per_worker: int | None = _opt(ge=0, le=64, description="default: 1 when the cluster has GPUs, else 0")
    cpus_per_worker: float | None = _opt(gt=0, le=1024, description="default: a GPU worker gets its node's CPUs per "
                                         "GPU for each GPU (so every GPU can be used); a CPU worker 1")
    memory_mb_per_worker: int | None = _opt(ge=1)
    gpu_memory_mb: int | None = _opt(ge=1, le=1 << 24, description="the memory each of a worker's GPUs must have "
                                     "(MiB): it is placed only on such GPUs, and refused at submit where the "
                                     "cluster has none")
    pids_per_worker: int | None = _opt(ge=16, le=1 << 22, description="processes and threads each worker may have "
                                       "(sandbox isolation); default: the plan's pids_per_worker for the tenant, "
                                       "else the server's DEEPPOD_PIDS_PER_WORKER")
    network: Literal["host", "isolated", "none"] | None = _opt(
        description="host: the host's network; isolated: its own (a network namespace) where only the API is "
                    "reachable; none: its own, nothing reachable (sandbox isolation; one node). Default: the "
                    "server's DEEPPOD_JOB_NETWORK (host)")
    requirements: str | None = _opt(max_length=65536, description="a requirements.txt's text: the job runs in a "
                                    "Python environment built from it (once per tenant and node, then cached)")
    python: str | None = _opt(max_length=16, description="its environment's Python, e.g. 3.12 (one the nodes have)")
    image: str | None = _opt(max_length=128, description="a container image this server offers, by name (GET "
                             "/v1/images): the job runs in it, sandboxed as any job")
    env: dict[str, str] = _opt(factory=dict)
    priority: int = _opt(0, ge=-1000, le=1000)
    grace_seconds: float | None = _opt(ge=0, le=3600)
    time_limit_seconds: float | None = _opt(gt=0, le=365 * 86400, description="the longest one run may last: then "
                                            "it is stopped as a stop would (SIGTERM, its grace to checkpoint) and "
                                            "'deeppod resume' goes on; on Slurm, its --time. Default: none (on "
                                            "Slurm, its partition's)")
    preemptible: bool = _opt(True)
    max_restarts: int = _opt(0, ge=0, le=100)
    stop_rules: list[dict] = _opt(factory=list, max_length=20, description="[{'kind': 'nan', 'metric': 'loss'}, "
                                  "{'kind': 'plateau', 'metric': 'val_loss', 'patience': 5, 'mode': 'min'}]")
    datasets: list[str] = _opt(factory=list, max_length=16, description="datasets to stage before start, "
                               "NAME[@VERSION]; each job worker finds its folder in DEEPPOD_DATA_<NAME>")
    models: list[str] = _opt(factory=list, max_length=8, description="registered models the job reads, "
                             "NAME[@VERSION or @ALIAS], pinned at submit; each worker finds the version's folder "
                             "(read-only) in DEEPPOD_MODEL_<NAME>")

    def body(self) -> dict:
        """The JSON body of ``POST /v1/jobs``."""
        return asdict(self)


FIELDS = tuple(f.name for f in fields(JobSpec))
# A field's options on `deeppod submit` (and keys of a --spec file), where not the field's own name.
CLI_OPTIONS = {"max_workers": ("workers",), "memory_mb_per_worker": ("memory",), "gpu_memory_mb": ("gpu-memory",),
               "grace_seconds": ("grace",), "time_limit_seconds": ("time",),
               "stop_rules": ("stop-on-nan", "stop-patience"), "datasets": ("dataset",),
               "models": ("model",)}


def cli_options(name: str) -> tuple[str, ...]:
    return CLI_OPTIONS.get(name, (name.replace("_", "-"),))
REQUIRED = tuple(f.name for f in fields(JobSpec) if f.default is MISSING and f.default_factory is MISSING)


def build(**values) -> JobSpec:
    """A JobSpec from keyword values; a name that is no field is refused with the nearest one."""
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        near = difflib.get_close_matches(unknown[0], FIELDS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise InvalidRequest(f"{unknown[0]!r} is not a job option{hint}; the options are {', '.join(FIELDS)}")
    missing = [n for n in REQUIRED if n not in values]
    if missing:
        raise InvalidRequest(f"a job needs {', '.join(missing)}")
    return JobSpec(**values)

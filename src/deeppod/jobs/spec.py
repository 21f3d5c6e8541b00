"""A batch job written as the spec file that submits it again: `deeppod submit --spec FILE`
reads what this writes (cli/spec.py reads every option of submit as a field of that name).
What the API never shows back stays out: --env values (only their names, in a comment)."""

from __future__ import annotations

from deeppod.errors import InvalidRequest
from deeppod.units import duration_text

# Set by the CLI itself on every submit (cli/values.exported_env), not by the user.
_EXPORTED = {"PATH", "VIRTUAL_ENV"}


def fields_of(job, own_code_dir: str) -> dict:
    """The submit options that made ``job``, as spec fields in the order `deeppod submit --help`
    lists them; options left at nothing are left out."""
    if job.kind != "batch":
        raise InvalidRequest(f"job {job.id} is a {job.kind} job, made by the platform (a search's trial, a "
                             "deployment's replica or an evaluation), not by submit: make it again as it was made "
                             "('deeppod tune', 'deeppod deploy')")
    out = {"name": job.name, "command": list(job.command),
           "workers": f"{job.workers}:{job.max_workers}" if job.max_workers else job.workers,
           "gpus-per-worker": job.gpus_per_worker, "cpus-per-worker": _number(job.cpus_per_worker),
           "memory": _size(job.memory_mb_per_worker), "gpu-memory": _size(job.gpu_memory_mb),
           "pids-per-worker": job.pids_per_worker,
           "requirements": [x for x in (job.requirements or "").splitlines() if x.strip()] or None,
           "python": job.python, "image": job.image, "network": job.network,
           "dataset": _refs(job.datasets), "model": _refs(job.models),
           # its own folder holds code sent with it (or nothing): a new submit sends its own
           "workdir": None if job.workdir == own_code_dir else job.workdir,
           "priority": job.priority or None, "grace": _number(job.grace_seconds),
           "time": duration_text(job.time_limit_seconds) if job.time_limit_seconds else None,
           "preemptible": job.preemptible, "max-restarts": job.max_restarts or None}
    for rule in job.stop_rules or []:
        if rule.get("kind") == "nan":
            out["stop-on-nan"] = rule["metric"]
        elif rule.get("kind") == "plateau":
            mode = ":max" if rule.get("mode") == "max" else ""
            out["stop-patience"] = f"{rule['metric']}:{rule['patience']}{mode}"
    return {k: v for k, v in out.items() if v is not None}


def spec_text(job, own_code_dir: str) -> str:
    import yaml

    fields = fields_of(job, own_code_dir)
    head = [f"# job {job.id} ({job.name}) as a spec: deeppod submit --spec THIS_FILE (options given beside it win)"]
    hidden = sorted(set(job.env or {}) - _EXPORTED)
    if hidden:
        head.append(f"# --env values are never shown back; give them again: {' '.join(f'-e {k}=...' for k in hidden)}")
    return "\n".join(head) + "\n" + yaml.safe_dump(fields, sort_keys=False, default_flow_style=None, width=100)


def _refs(inputs: list | None) -> list[str] | None:
    """The versions a job was pinned to (``{"ref": "digits@2", ...}``), as it would name them again."""
    return [x["ref"] if isinstance(x, dict) else x for x in inputs or []] or None


def _size(mb: int | None) -> str | None:
    return None if mb is None else (f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M")


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x

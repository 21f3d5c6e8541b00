"""Notebooks: JupyterLab as a job of kind ``notebook`` in its tenant's sandbox, under the same
plan, quota and queue as any job, reached only through the control plane (``/notebooks/ID/``,
ui/routes/notebook_proxy.py); stopped when idle (idle.py), resumed with its files."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from deeppod.auth.service import Principal
from deeppod.errors import InvalidRequest, NotFound
from deeppod.job_spec import JobSpec
from deeppod.jobs import service as jobs
from deeppod.notebooks.upstream import SOCKET_NAME, base_path
from deeppod.plans.service import plan_now
from deeppod.store.models import Job
from deeppod.units import duration_text

KIND = "notebook"


@dataclass
class NotebookStart:
    """What ``deeppod notebook start`` asks for: a job's resources and software, and how long it
    may sit idle (seconds; None: the plan's, else the server's)."""

    name: str | None = None
    gpus_per_worker: int | None = None
    cpus_per_worker: float | None = None
    memory_mb_per_worker: int | None = None
    requirements: str | None = None
    python: str | None = None
    image: str | None = None
    datasets: list[str] = field(default_factory=list)
    network: str | None = None
    priority: int = 0
    idle_seconds: float | None = None


def command(job_id: int, python: str) -> list[str]:
    """JupyterLab on a unix socket in its working folder (upstream.py), served under
    ``/notebooks/ID/``, its token from ``JUPYTER_TOKEN`` (jobs/launch.py), nothing asked of the
    internet (no update checks, no extension manager's index)."""
    return [python, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--ServerApp.sock={SOCKET_NAME}",
            "--ServerApp.sock_mode=0600", f"--ServerApp.base_url={base_path(job_id)}",
            "--ServerApp.allow_remote_access=True", "--ServerApp.root_dir=.",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly", "--LabApp.news_url=None"]


def idle_limit(session: Session, tenant: str, asked: float | None, server_default: float) -> float:
    """The plan's ``notebook_idle_hours`` on the tenant's path (the tightest) is the default and
    the most one may ask; without one, the server's."""
    cap = plan_now(session).cap(tenant, "notebook_idle_hours")
    most = cap * 3600 if cap is not None else None
    if asked is None:
        return most if most is not None else server_default
    if asked <= 0:
        raise InvalidRequest(f"--idle must be more than 0 (got {asked:g} s), e.g. 30m or 2h")
    if most is not None and asked > most:
        raise InvalidRequest(f"--idle {duration_text(asked)} is more than tenant {tenant}'s plan allows a notebook to "
                             f"sit idle ({duration_text(most)}): ask for {duration_text(most)} or less")
    return asked


def start(session: Session, principal: Principal, ask: NotebookStart, *, idle_default: float,
          **submit) -> Job:
    """A notebook job, queued as any job. ``submit``: what ``jobs.submit`` takes besides the spec
    (the server's roots, code store, jobs folder, defaults)."""
    limit = idle_limit(session, principal.tenant, ask.idle_seconds, idle_default)
    python = "python" if ask.requirements or ask.image else sys.executable  # its environment's, or the server's
    spec = JobSpec(command=command(0, python), name=ask.name or "notebook", workers=1,
                   gpus_per_worker=ask.gpus_per_worker, cpus_per_worker=ask.cpus_per_worker,
                   memory_mb_per_worker=ask.memory_mb_per_worker, requirements=ask.requirements, python=ask.python,
                   image=ask.image, datasets=list(ask.datasets), network=ask.network, priority=ask.priority,
                   preemptible=True, max_restarts=0)
    job = jobs.submit(session, principal, spec, **submit)
    job.kind, job.idle_limit_seconds = KIND, limit
    job.command = command(job.id, python)  # served under its own id, known now
    return job


def get_notebook(session: Session, principal: Principal, job_id: int) -> Job:
    job = jobs.get_job(session, principal, job_id)
    if job.kind != KIND:
        raise NotFound(f"job {job_id} is not a notebook: 'deeppod notebook ls' lists yours")
    return job


def reachable(session: Session, principal: Principal, job_id: int) -> Job:
    """The notebook behind ``/notebooks/ID/``: its owner's, or any for an administrator. Anyone
    else, its tenant's other members included, is told it does not exist (a notebook runs code
    as its owner's work)."""
    try:
        job = get_notebook(session, principal, job_id)
    except NotFound:
        job = None
    if job is None or not (principal.is_admin or job.user_id == principal.user_id) or principal.job_id is not None:
        raise NotFound(f"notebook {job_id} not found: 'deeppod notebook ls' lists yours")
    return job


def list_notebooks(session: Session, principal: Principal, *, limit: int = 200):
    """(job, tenant, user) of the notebooks the caller sees, newest first."""
    return jobs.list_jobs(session, principal, limit=limit, where=jobs.JobFilter(kinds=(KIND,)))


def stop(session: Session, principal: Principal, job_id: int) -> Job:
    """Stop it (resumable): its workers get SIGTERM; its folder, and every file in it, stays."""
    get_notebook(session, principal, job_id)
    return jobs.stop(session, principal, job_id)


def resume(session: Session, principal: Principal, job_id: int, *, idle_default: float,
           idle_seconds: float | None = None) -> Job:
    """Back in the queue, same id and folder: what was written in it is there again."""
    job = get_notebook(session, principal, job_id)
    if idle_seconds is not None:
        job.idle_limit_seconds = idle_limit(session, principal.tenant, idle_seconds, idle_default)
    return jobs.resume(session, principal, job_id)


def url(job_id: int) -> str:
    """The path its owner opens (under the server's URL)."""
    return base_path(job_id) + "lab"


"""Job lifecycle service: submit, list, show, cancel, events. Takes the DB session."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from deeppod.atomic import move_into_place
from deeppod.auth import scope
from deeppod.auth.paths import TenantRoots
from deeppod.auth.service import Principal, revoke_job_tokens
from deeppod.cluster.service import capacity
from deeppod.contract import ENV_NAME_RE, FINAL_STATES, MOVES, JobState, job_path, reserved
from deeppod.datasets.service import resolve_for_job
from deeppod.envs import images
from deeppod.envs import names as env_names
from deeppod.envs import spec as env_spec
from deeppod.errors import Conflict, Forbidden, InvalidRequest, NotFound
from deeppod.job_folder import JobFolder
from deeppod.job_spec import JobSpec
from deeppod.jobs import code as code_store
from deeppod.jobs import quotas
from deeppod.jobs.code import CodeStore
from deeppod.jobs.stop_rules import check_rules
from deeppod.jobs.stopping import request_stop
from deeppod.store.events import add_event  # noqa: F401 - jobs.service.add_event, as its callers write it
from deeppod.store.models import Job, JobEvent, Tenant, User, utcnow

# submitted work, replicas, model comparisons, search trials, JupyterLab (notebooks/)
JOB_KINDS = ("batch", "serve", "evaluate", "trial", "notebook")

log = logging.getLogger(__name__)


def _resolve_executable(cmd0: str, workdir: str, env: dict[str, str]) -> str:
    if os.sep in cmd0:
        path = cmd0 if os.path.isabs(cmd0) else os.path.join(workdir, cmd0)
        if not os.path.isfile(path):
            raise InvalidRequest(f"executable {cmd0!r} does not exist (looked at {path}); fix the path")
        if not os.access(path, os.X_OK):
            raise InvalidRequest(f"{path} is not executable: run 'chmod +x {path}' or start it with an interpreter")
        return path
    search = env.get("PATH") or job_path(os.environ.get("PATH", os.defpath), os.environ.get("HOME", ""))
    found = shutil.which(cmd0, path=search)
    if found is None:  # the PATH said is the job's own (contract.base_environment), never the server's
        raise InvalidRequest(
            f"executable {cmd0!r} was not found on the job's PATH; give its full path, or pass "
            f"--env PATH=... (searched: {search})")
    return found


def default_cpus(gpus_per_worker: int, cap: dict) -> float:
    """A CPU worker asks for 1 CPU; a GPU worker for its share of a GPU node's CPUs, so that
    CPU requests never leave a GPU idle (2 cores and 4 GPUs: 0.5 CPU per GPU)."""
    if gpus_per_worker == 0 or not cap.get("cpus_per_gpu"):
        return 1.0
    return max(0.01, int(gpus_per_worker * cap["cpus_per_gpu"] * 100) / 100)


def with_defaults(req: JobSpec, cap: dict) -> JobSpec:
    """Fill what the user left out from what the cluster has."""
    gpus = req.gpus_per_worker if req.gpus_per_worker is not None else (1 if cap["gpus"] > 0 else 0)
    cpus = req.cpus_per_worker if req.cpus_per_worker is not None else default_cpus(gpus, cap)
    return replace(req, gpus_per_worker=gpus, cpus_per_worker=cpus)


def check_gpu_memory(need_mb: int | None, gpus_per_worker: int, cap: dict) -> None:
    """A request for GPUs of ``need_mb`` MiB each that no node can meet is refused now, with
    what the largest have; a cluster whose GPUs do not say (logical slots) takes any request."""
    if need_mb is None:
        return
    if need_mb < 1:
        raise InvalidRequest(f"gpu_memory_mb must be at least 1 MiB (got {need_mb})")
    if not gpus_per_worker:
        raise InvalidRequest(f"the job asks for GPUs of {need_mb} MiB but for no GPU: give --gpus-per-worker, "
                             "or leave out --gpu-memory")
    if not cap["gpu_memory_unknown"] and need_mb > cap["max_gpu_memory_mb"]:
        have = f"the largest GPUs have {cap['max_gpu_memory_mb']} MiB" if cap["max_gpu_memory_mb"] else "it has none"
        raise InvalidRequest(f"each GPU must have {need_mb} MiB of memory but {have} ({cap['gpus']} GPUs in the "
                             "cluster); shard the model over more workers, offload it, or lower the batch")


def validate(req: JobSpec, cap: dict) -> None:
    """Everything that can be checked before anything is written."""
    if not req.command or not req.command[0]:
        raise InvalidRequest("the job has no command: put it after '--', e.g. deeppod submit -- python train.py")
    if not os.path.isabs(req.workdir):
        raise InvalidRequest(f"working directory {req.workdir!r} must be an absolute path")
    if not os.path.isdir(req.workdir):
        raise InvalidRequest(f"working directory {req.workdir!r} does not exist on the server; create it or pick "
                             f"another")
    if req.workers < 1:
        raise InvalidRequest(f"workers must be at least 1 (got {req.workers})")
    if req.max_workers is not None and req.max_workers < req.workers:
        raise InvalidRequest(f"max_workers ({req.max_workers}) is below workers ({req.workers}); "
                             "for an elastic job pass --workers MIN:MAX with MIN <= MAX")
    if not 0 <= req.max_restarts <= 100:
        raise InvalidRequest(f"max_restarts must be between 0 and 100 (got {req.max_restarts})")
    if req.gpus_per_worker < 0:
        raise InvalidRequest(f"gpus_per_worker must be 0 or more (got {req.gpus_per_worker})")
    if req.cpus_per_worker <= 0:
        raise InvalidRequest(f"cpus_per_worker must be more than 0 (got {req.cpus_per_worker})")
    if req.memory_mb_per_worker is not None and req.memory_mb_per_worker < 1:
        raise InvalidRequest(f"memory_mb_per_worker must be at least 1 MiB (got {req.memory_mb_per_worker})")
    for key in req.env:
        if not ENV_NAME_RE.match(key):
            raise InvalidRequest(f"environment variable name {key!r} is not valid: use letters, digits and '_'")
        if reserved(key):
            raise InvalidRequest(f"environment variable {key} is set by DeepPod for every worker "
                                 "(the job contract, docs/jobs.md); remove it from --env")
    total_gpus = req.workers * req.gpus_per_worker
    if total_gpus > cap["gpus"]:
        raise InvalidRequest(f"the job asks for {total_gpus} GPUs ({req.workers} workers x {req.gpus_per_worker}) "
                             f"but the whole cluster has {cap['gpus']}; ask for fewer workers or GPUs")
    if req.gpus_per_worker > cap["max_node_gpus"]:
        raise InvalidRequest(f"one worker asks for {req.gpus_per_worker} GPUs but the largest node has "
                             f"{cap['max_node_gpus']}; use more workers with fewer GPUs each")
    if req.cpus_per_worker > cap["max_node_cpus"]:
        raise InvalidRequest(f"one worker asks for {req.cpus_per_worker} CPUs but the largest node has "
                             f"{cap['max_node_cpus']}")
    if req.workers * req.cpus_per_worker > cap["cpus"]:
        raise InvalidRequest(f"the job asks for {req.workers * req.cpus_per_worker:g} CPUs in all but the cluster "
                             f"has {cap['cpus']}; lower --cpus-per-worker or --workers")
    mem = req.memory_mb_per_worker or 0
    if mem > cap["max_node_memory_mb"] or req.workers * mem > cap["memory_mb"]:
        raise InvalidRequest(f"the job asks for {req.workers} x {mem} MiB of memory but the largest node has "
                             f"{cap['max_node_memory_mb']} MiB and the cluster {cap['memory_mb']} MiB")
    check_gpu_memory(req.gpu_memory_mb, req.gpus_per_worker, cap)
    if req.grace_seconds is not None and not 0 <= req.grace_seconds <= 3600:
        raise InvalidRequest(f"grace_seconds must be between 0 and 3600 (got {req.grace_seconds})")
    # a program of the job's image, or one its requirements install, is not on the server's PATH
    if req.image is None and not (req.requirements and os.sep not in req.command[0]):
        _resolve_executable(req.command[0], req.workdir, req.env)
    check_rules(req.stop_rules)


# (session, caller, ["NAME@V", ...]) -> [{"ref", "version_id", "env", "path"}]
ModelResolver = Callable[[Session, Principal, list[str]], list[dict]]


def default_name(command: list[str]) -> str:
    """The script a command runs (train.py), else the program's name (python)."""
    script = next((a for a in command[1:] if a.endswith((".py", ".sh"))), None)
    return Path(script or command[0]).name[:64]


def submit(session: Session, principal: Principal, req: JobSpec, *, default_grace: float,
           roots: TenantRoots | None = None, read_paths: list[str] | None = None,
           code: CodeStore | None = None, jobs_dir: Path | None = None, default_network: str = "host",
           image_dir: str | None = None, default_pids: int = 4096, package_index: dict | None = None,
           resolve_models: ModelResolver | None = None) -> Job:
    """``roots``: where this server lets a tenant's jobs work (sandbox isolation; None: anywhere).
    ``image_dir``: the container images it offers (DEEPPOD_IMAGE_DIR; None: none).
    ``package_index``: where this server's builds install from (its requirements' names are
    checked there: envs/names.py); None: not checked.
    ``read_paths``: what a platform-made job may read besides its workdir. Without a workdir
    the job works in a folder of its own, JOB_DIR/code: the code it was sent with
    (``req.code``, kept in ``code``), or empty. ``resolve_models``: pins ``req.models`` to
    versions (the registry's, models/service.resolve_for_job: it sits above this layer)."""
    req = replace(req, network=_network(req.network or default_network, sandboxed=roots is not None))
    _check_image(req, image_dir, sandboxed=roots is not None)
    quotas.check_pids(session, principal.tenant, req.pids_per_worker, default_pids)
    quotas.check_asks(session, principal.tenant, memory_mb=req.memory_mb_per_worker, cpus=req.cpus_per_worker,
                       gpu_memory_mb=req.gpu_memory_mb)
    if req.workdir is not None and req.code is not None:
        raise InvalidRequest("give either workdir (a folder on the server) or code (sent with the job), not both")
    models: list[dict] = []
    if req.models:
        if resolve_models is None:
            raise InvalidRequest("this kind of job reads no registered model: leave models out")
        models = resolve_models(session, principal, req.models)  # pinned now: what the job records
        read_paths = [*(read_paths or []), *(m["path"] for m in models)]
    if req.workdir is None:
        if code is None or jobs_dir is None:
            raise InvalidRequest("give the job a workdir: an absolute folder on the server")
        return _submit_in_own_folder(session, principal, req, default_grace, read_paths, code, jobs_dir,
                                     package_index, models)
    if roots is not None:  # before anything looks at the folder: the answer must not say whether it exists
        req = replace(req, workdir=roots.check("the working directory", req.workdir, principal.tenant))
    return _submit(session, principal, req, default_grace, read_paths, package_index, models)


NETWORKS = ("host", "isolated", "none")


def _check_image(req: JobSpec, image_dir: str | None, sandboxed: bool) -> None:
    if req.image is None:
        return
    images.check_name(req.image, image_dir)
    if not sandboxed:
        raise InvalidRequest(f"--image {req.image}: images run in sandboxes, and this server runs jobs without one "
                             "(it is not root): leave --image out")
    if req.requirements or req.python:
        raise InvalidRequest(f"--image {req.image} brings its own software: leave out --requirements and --python "
                             "(install the packages into the image)")


def _network(asked: str, sandboxed: bool) -> str:
    if asked not in NETWORKS:
        raise InvalidRequest(f"network {asked!r} is not one of host (the host's network), isolated (its own, only the "
                             "API reachable) or none (its own, nothing reachable)")
    if asked != "host" and not sandboxed:
        raise InvalidRequest(f"--network {asked} needs a server that sandboxes jobs (sandbox isolation, as root); "
                             "this one runs them as itself: leave --network out")
    return asked


def _submit_in_own_folder(session: Session, principal: Principal, req: JobSpec, default_grace: float,
                          read_paths: list[str] | None, code: CodeStore, jobs_dir: Path,
                          package_index: dict | None, models: list[dict]) -> Job:
    """Unpacked (or empty) in a staging folder first, so that the job is checked against its
    files before it exists; moved to JOB_DIR/code once it has an id."""
    own = code_store.staged(jobs_dir)
    try:
        if req.code is not None:
            code.unpack(principal.tenant_id, req.code, own)
        try:
            job = _submit(session, principal, replace(req, workdir=str(own)), default_grace, read_paths,
                          package_index, models)
        except InvalidRequest as exc:  # name the folder as the user knows it, not where it is staged
            raise InvalidRequest(str(exc).replace(str(own), "<the job's folder>")) from None
        final = JobFolder.of(jobs_dir, job.id).code
        shutil.rmtree(final, ignore_errors=True)  # a folder left by a database that was reset
        final.parent.mkdir(parents=True, exist_ok=True)
        move_into_place(own, final)
    finally:
        code_store.discard(own)
    job.workdir = str(final)
    return job


def _submit(session: Session, principal: Principal, req: JobSpec, default_grace: float,
            read_paths: list[str] | None, package_index: dict | None = None, models: list[dict] = ()) -> Job:
    cap = capacity(session)
    req = with_defaults(req, cap)
    validate(req, cap)
    wanted = env_spec.parse(req.requirements, req.python)
    quotas.check_indexes(session, principal.tenant, wanted.indexes if wanted else [])
    if wanted is not None and package_index is not None and req.image is None:
        env_names.check(wanted, wanted.index(package_index))
    quotas.check_submit(session, principal.tenant)
    datasets = resolve_for_job(session, principal, req.datasets)
    name = req.name or default_name(req.command)
    job = Job(
        name=name[:128], tenant_id=principal.tenant_id, user_id=principal.user_id, state=JobState.QUEUED,
        command=list(req.command), workdir=req.workdir, env=dict(req.env), workers=req.workers,
        max_workers=req.max_workers if req.max_workers != req.workers else None,
        preemptible=req.preemptible, max_restarts=req.max_restarts, stop_rules=check_rules(req.stop_rules),
        gpus_per_worker=req.gpus_per_worker, cpus_per_worker=req.cpus_per_worker,
        memory_mb_per_worker=req.memory_mb_per_worker, gpu_memory_mb=req.gpu_memory_mb,
        pids_per_worker=req.pids_per_worker, priority=req.priority,
        network=req.network or "host", python=wanted.python if wanted else None,
        requirements="\n".join(wanted.lines()) if wanted else None, image=req.image,
        grace_seconds=default_grace if req.grace_seconds is None else req.grace_seconds, datasets=datasets,
        time_limit_seconds=req.time_limit_seconds,
        read_paths=list(read_paths or []), models=list(models),
    )
    session.add(job)
    session.flush()
    add_event(session, job, JobState.QUEUED, f"submitted by {principal.user}")
    return job


def seal_legacy_env(session: Session) -> int:
    """Seal the --env values of jobs stored before they were sealed; how many."""
    count = 0
    for job_id, raw in session.execute(text("SELECT id, env FROM jobs")):
        value = json.loads(raw) if isinstance(raw, str) else raw
        if value and not (isinstance(value, dict) and set(value) == {"sealed"}):
            flag_modified(session.get(Job, job_id), "env")
            count += 1
    return count


def get_job(session: Session, principal: Principal, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None or not scope.may_see(principal, job):  # another tenant's: as if missing
        raise NotFound(f"no job with id {job_id}: list yours with 'deeppod jobs'")
    return job


def manage_job(session: Session, principal: Principal, job_id: int, verb: str) -> Job:
    """A job the caller may change: its own, or any of its tenant's for tenant admins and
    admins. Platform jobs (replicas, comparisons) belong to their deployment or model, which
    the tenant shares."""
    job = get_job(session, principal, job_id)
    if job.kind in ("batch", "trial") and not principal.may_manage(job.user_id):
        raise Forbidden(f"job {job_id} is another user's; only they or a tenant admin can {verb} it")
    return job


@dataclass
class JobFilter:
    """What 'deeppod jobs' narrows the list to; every field optional."""

    state: str | None = None
    kinds: tuple[str, ...] = ()  # only these kinds (JOB_KINDS)
    exclude_kinds: tuple[str, ...] = ()
    tenant: str | None = None
    user: str | None = None
    name: str | None = None  # a part of the name


# what a job list may be ordered by (the console's sortable columns)
JOB_SORTS = {"id": Job.id, "name": Job.name, "state": Job.state, "tenant": Tenant.name, "user": User.name,
             "gpus": Job.workers * Job.gpus_per_worker, "submitted": Job.submitted_at}


def _jobs_query(principal: Principal, f: JobFilter):
    if f.state is not None and f.state not in set(JobState):
        raise InvalidRequest(f"unknown state {f.state!r}: use one of {', '.join(JobState)}")
    for k in (*f.kinds, *f.exclude_kinds):
        if k not in JOB_KINDS:
            raise InvalidRequest(f"unknown job kind {k!r}: use one of {', '.join(JOB_KINDS)}")
    q = scope.visible(select(Job, Tenant.name, User.name).join(Tenant, Job.tenant_id == Tenant.id)
                      .join(User, Job.user_id == User.id), Job, principal)
    if f.state is not None:
        q = q.where(Job.state == f.state)
    if f.kinds:
        q = q.where(Job.kind.in_(f.kinds))
    if f.exclude_kinds:
        q = q.where(Job.kind.not_in(f.exclude_kinds))
    if f.tenant:
        q = q.where(Tenant.name == f.tenant)
    if f.user:
        q = q.where(User.name == f.user)
    if f.name:
        q = q.where(Job.name.contains(f.name, autoescape=True))
    return q


def list_jobs(session: Session, principal: Principal, where: JobFilter | None = None,
              limit: int = 200, offset: int = 0, sort: str = "-id") -> list[tuple[Job, str, str]]:
    """Jobs with their tenant and user names, newest first (``sort``: a JOB_SORTS key, '-' for
    descending; ties newest first)."""
    key = sort.removeprefix("-")
    if key not in JOB_SORTS:
        raise InvalidRequest(f"jobs cannot be sorted by {key!r}: use one of {', '.join(JOB_SORTS)}")
    column = JOB_SORTS[key]
    q = (_jobs_query(principal, where or JobFilter())
         .order_by(column.desc() if sort.startswith("-") else column.asc(), Job.id.desc())
         .limit(limit).offset(offset))
    return [(r[0], r[1], r[2]) for r in session.execute(q)]


def count_jobs(session: Session, principal: Principal, where: JobFilter | None = None) -> int:
    q = _jobs_query(principal, where or JobFilter()).with_only_columns(func.count()).order_by(None)
    return session.scalar(q) or 0


def owner_names(session: Session, job: Job) -> tuple[str, str]:
    tenant = session.get(Tenant, job.tenant_id)
    user = session.get(User, job.user_id)
    return tenant.name, user.name


def _end(session: Session, principal: Principal, job_id: int, verb: str, final: JobState) -> Job | None:
    """The part cancel and stop share: a queued job ends at once; a running one is returned
    for the caller to mark (the reconcile loop then sends SIGTERM, the grace, SIGKILL)."""
    job = manage_job(session, principal, job_id, verb)
    if job.state in FINAL_STATES:
        raise Conflict(f"job {job_id} has already ended ({job.state}); nothing to {verb}")
    if job.state == JobState.QUEUED:
        finish(session, job, final, f"{final} by {principal.user} while it was queued")
        return None
    return job


def cancel(session: Session, principal: Principal, job_id: int) -> Job:
    job = _end(session, principal, job_id, "cancel", JobState.CANCELLED)
    if job is not None and not job.cancel_requested:
        job.cancel_requested = True
        job.stop_requested_at = job.stop_requested_at or utcnow()
        add_event(session, job, "cancel-requested",
                  f"{principal.user} asked to cancel; workers get SIGTERM, then SIGKILL after {job.grace_seconds:g} s")
    return job or get_job(session, principal, job_id)


def stop(session: Session, principal: Principal, job_id: int) -> Job:
    """Graceful stop: SIGTERM so the job checkpoints and exits; it ends as ``stopped``."""
    job = _end(session, principal, job_id, "stop", JobState.STOPPED)
    if job is not None and job.stop_reason is None:
        request_stop(session, job, f"stopped by {principal.user}", told=f"{principal.user} asked for a graceful stop")
    return job or get_job(session, principal, job_id)


def run_seconds(job: Job, now: datetime | None = None) -> float:
    """How long a job has run, every run added up: the earlier ones (ran_seconds) and the
    current one until now or its end; a queued job's clock does not run."""
    total = job.ran_seconds or 0.0
    running = job.ended_at is None and JobState(job.state).holds_resources
    if job.started_at is not None and (running or job.ended_at is not None):
        end = job.ended_at if job.ended_at is not None else (now or datetime.now(UTC))
        total += max(0.0, (end - job.started_at).total_seconds())
    return total


def resume(session: Session, principal: Principal, job_id: int) -> Job:
    """Put a gracefully stopped job back in the queue: same id, same checkpoint folder."""
    job = manage_job(session, principal, job_id, "resume")
    if job.state != JobState.STOPPED:
        raise Conflict(f"job {job_id} is {job.state}; only a stopped job can be resumed "
                       "(a cancelled or failed one starts over: submit it again)")
    if job.purged_at is not None:
        raise Conflict(f"job {job_id}'s files (and its checkpoint) were removed: submit it again")
    quotas.check_submit(session, session.get(Tenant, job.tenant_id).name)
    if job.started_at is not None and job.ended_at is not None:  # the run that stopped counts in its duration
        job.ran_seconds += max(0.0, (job.ended_at - job.started_at).total_seconds())
    move(session, job, JobState.QUEUED, f"resumed by {principal.user}", stop_reason=None, ended_at=None,
         stop_requested_at=None)
    add_event(session, job, "resumed", f"{principal.user} resumed it; it continues from its last checkpoint")
    return job


def move(session: Session, job: Job, to: JobState, reason: str | None = None, **fields) -> bool:
    """The one place a job's state changes, along ``contract.MOVES``, with the columns that go
    with it (``fields``); an illegal move is refused (False), logged and recorded among the job's
    events, and the job is left as it was."""
    was = JobState(job.state)
    if to not in MOVES[was]:
        log.error("job %s: a move from %s to %s was refused (not in contract.MOVES)", job.id, was, to)
        add_event(session, job, "illegal-move", f"a move from {was} to {to} was refused ({reason or 'no reason'})")
        return False
    job.state = to
    if reason is not None:
        job.reason = reason
    for name, value in fields.items():
        setattr(job, name, value)
    return True


def finish(session: Session, job: Job, state: JobState, reason: str, exit_codes: dict[int, int] | None = None) -> None:
    """The job ends for good; the tokens its processes were given go with it."""
    if not move(session, job, state, reason):
        return
    revoke_job_tokens(session, job.id)
    job.ended_at = utcnow()
    if exit_codes is not None:
        job.exit_codes = {str(k): v for k, v in sorted(exit_codes.items())}
    add_event(session, job, str(state), reason)


def list_events(session: Session, principal: Principal, job_id: int) -> list[JobEvent]:
    get_job(session, principal, job_id)
    return list(session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)))


def is_finished(session: Session, job_id: int) -> bool:
    job = session.get(Job, job_id)
    return job is None or job.state in FINAL_STATES

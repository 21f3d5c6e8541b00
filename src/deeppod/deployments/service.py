"""Deployments through the store: create, update, rollback, delete, replicas, keys."""

from __future__ import annotations

import logging
import re
import secrets
import sys
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from deeppod.auth import scope
from deeppod.auth.service import Principal, check_name, principal_of
from deeppod.auth.tokens import hash_secret, new_secret
from deeppod.cluster.service import capacity
from deeppod.contract import ACTIVE_STATES, ENV_REPLICA_SECRET, JobState
from deeppod.deployments.direct_key import replica_env
from deeppod.errors import Conflict, Forbidden, InvalidRequest, NotFound
from deeppod.job_spec import JobSpec
from deeppod.jobs import service as jobs
from deeppod.models import service as models
from deeppod.states import DeploymentState
from deeppod.store.models import Deployment, DeploymentKey, Job, Model, ModelVersion, Node, Tenant, User, utcnow

log = logging.getLogger(__name__)
KEY_PREFIX = "dpk_"
URL_RE = re.compile(r"^http://(?P<host>[A-Za-z0-9.\-]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$")
MAX_RESTARTS = 3  # per replica; the controller starts a fresh one after that (rollout.MAX_FAILED_STARTS)


def _check(replicas: int | None, gpus: int | None, cpus: float | None, max_batch: int | None,
           max_wait_ms: float | None) -> None:
    if replicas is not None and not 1 <= replicas <= 64:
        raise InvalidRequest(f"replicas must be between 1 and 64 (got {replicas})")
    if gpus is not None and not 0 <= gpus <= 16:
        raise InvalidRequest(f"gpus_per_replica must be between 0 and 16 (got {gpus})")
    if cpus is not None and not 0 < cpus <= 256:
        raise InvalidRequest(f"cpus_per_replica must be above 0 and at most 256 (got {cpus})")
    if max_batch is not None and not 1 <= max_batch <= 1024:
        raise InvalidRequest(f"max_batch must be between 1 and 1024 (got {max_batch})")
    if max_wait_ms is not None and not 0 <= max_wait_ms <= 1000:
        raise InvalidRequest(f"max_wait_ms must be between 0 and 1000 (got {max_wait_ms})")


def _fits(session: Session, replicas: int, gpus: int, cpus: float) -> None:
    cap = capacity(session)
    if replicas * gpus > cap["gpus"] or gpus > cap["max_node_gpus"]:
        raise InvalidRequest(f"{replicas} replicas x {gpus} GPUs do not fit: the cluster has {cap['gpus']} GPUs "
                             f"(at most {cap['max_node_gpus']} on one node); ask for fewer")
    if cpus > cap["max_node_cpus"]:
        raise InvalidRequest(f"a replica asks for {cpus:g} CPUs but the largest node has {cap['max_node_cpus']}")


def get(session: Session, principal: Principal, name: str) -> Deployment:
    dep = session.scalar(scope.own(select(Deployment).where(Deployment.name == name), Deployment, principal))
    if dep is None:
        raise NotFound(f"no deployment {name!r} in tenant {principal.tenant}: list them with 'deeppod deploy ls'")
    return dep


def list_deployments(session: Session, principal: Principal) -> list[Deployment]:
    q = scope.visible(select(Deployment).order_by(Deployment.name), Deployment, principal)
    return list(session.scalars(q))


def create(session: Session, principal: Principal, name: str, model_ref: str, *, replicas: int = 1,
           gpus_per_replica: int = 0, cpus_per_replica: float = 1.0, max_batch: int = 32,
           max_wait_ms: float = 5.0) -> Deployment:
    check_name("deployment", name)
    _check(replicas, gpus_per_replica, cpus_per_replica, max_batch, max_wait_ms)
    model, version = models.get_version(session, principal, model_ref)
    if not scope.owns(principal, model):
        raise Forbidden("deploy models of your own tenant")
    models.check_image_model(model.name, version, "serving")
    if session.scalar(scope.own(select(Deployment.id).where(Deployment.name == name), Deployment,
                                principal)) is not None:
        raise Conflict(f"deployment {name!r} exists: change it with 'deeppod deploy update {name} --version V', "
                       f"or remove it with 'deeppod deploy rm {name}'")
    _fits(session, replicas, gpus_per_replica, cpus_per_replica)
    dep = Deployment(tenant_id=principal.tenant_id, name=name, model_id=model.id, version_id=version.id,
                     replicas=replicas, gpus_per_replica=gpus_per_replica, cpus_per_replica=cpus_per_replica,
                     max_batch=max_batch, max_wait_ms=max_wait_ms, created_by=principal.user_id,
                     reason="waiting for replicas")
    session.add(dep)
    session.flush()
    log.info("deployment %s/%s: %s@%d x%d", principal.tenant, name, model.name, version.version, replicas)
    return dep


def update(session: Session, principal: Principal, name: str, *, version: str | None = None,
           replicas: int | None = None, max_batch: int | None = None, max_wait_ms: float | None = None
           ) -> Deployment:
    """A new version rolls out replica by replica; batching changes restart replicas the same way."""
    dep = get(session, principal, name)
    _check(replicas, None, None, max_batch, max_wait_ms)
    changed = False
    if version is not None:
        model = session.get(Model, dep.model_id)
        target = models.resolve(session, model, version)
        models.check_image_model(model.name, target, "serving")
        if target.id == dep.version_id and replicas is None and max_batch is None and max_wait_ms is None:
            raise Conflict(f"deployment {name!r} already serves {model.name}@{target.version}")
        if target.id != dep.version_id:
            dep.previous_version_id, dep.version_id = dep.version_id, target.id
            changed = True
    if replicas is not None and replicas != dep.replicas:
        _fits(session, replicas, dep.gpus_per_replica, dep.cpus_per_replica)
        dep.replicas = replicas
    for field, value in (("max_batch", max_batch), ("max_wait_ms", max_wait_ms)):
        if value is not None and value != getattr(dep, field):
            setattr(dep, field, value)
            changed = True
    if changed:
        dep.updated_at = utcnow()
        dep.state, dep.reason = DeploymentState.UPDATING, "rolling out"
    return dep


def rollback(session: Session, principal: Principal, name: str) -> Deployment:
    dep = get(session, principal, name)
    if dep.previous_version_id is None:
        raise Conflict(f"deployment {name!r} has served only one version: there is nothing to roll back to")
    dep.version_id, dep.previous_version_id = dep.previous_version_id, dep.version_id
    dep.updated_at = utcnow()
    dep.state, dep.reason = DeploymentState.UPDATING, "rolling back"
    return dep


def replicas(session: Session, dep: Deployment, active_only: bool = True) -> list[Job]:
    q = select(Job).where(Job.deployment_id == dep.id, Job.kind == "serve").order_by(Job.id)
    if active_only:
        q = q.where(Job.state.in_(ACTIVE_STATES))
    return list(session.scalars(q))


def delete(session: Session, principal: Principal, name: str) -> None:
    dep = get(session, principal, name)
    for job in replicas(session, dep):
        jobs.cancel(session, principal, job.id)
    for key in session.scalars(select(DeploymentKey).where(DeploymentKey.deployment_id == dep.id)):
        session.delete(key)
    session.delete(dep)


def version_of(session: Session, version_id: int | None) -> ModelVersion | None:
    return session.get(ModelVersion, version_id) if version_id is not None else None


def owner(session: Session, dep: Deployment) -> Principal:
    """The deployment's creator: its replicas run as theirs, under their tenant's plan."""
    user = session.get(User, dep.created_by)
    tenant = session.get(Tenant, dep.tenant_id)
    return principal_of(user, tenant)


def start_replica(session: Session, dep: Deployment, *, models_root: Path, default_grace: float,
                  max_body_bytes: int) -> Job:
    version = session.get(ModelVersion, dep.version_id)
    model = session.get(Model, dep.model_id)
    command = [sys.executable, "-m", "deeppod.serve.replica", "--model-dir", str(models_root / version.key),
               "--name", dep.name, "--version", str(version.version), "--max-batch", str(dep.max_batch),
               "--max-wait-ms", f"{dep.max_wait_ms:g}", "--max-body-bytes", str(max_body_bytes)]
    job = jobs.submit(session, owner(session, dep), JobSpec(
        command=command, workdir="/", name=f"serve-{dep.name}-{model.name}-v{version.version}",
        gpus_per_worker=dep.gpus_per_replica, cpus_per_worker=dep.cpus_per_replica, preemptible=False,
        max_restarts=MAX_RESTARTS, priority=100), default_grace=default_grace,
        read_paths=[str(models_root / version.key)])  # its sandbox reads this version only
    job.kind, job.deployment_id, job.model_version_id = "serve", dep.id, version.id
    # its own secret, sealed with the job's env: the replica answers only callers that send it
    # and its deployment's key for direct tokens (deployments/direct.py)
    job.env = {**(job.env or {}), ENV_REPLICA_SECRET: secrets.token_urlsafe(32), **replica_env(dep.id)}
    return job


def failed_starts(session: Session, dep: Deployment) -> int:
    return session.scalar(select(func.count(Job.id)).where(
        Job.deployment_id == dep.id, Job.model_version_id == dep.version_id, Job.state == JobState.FAILED,
        Job.submitted_at >= dep.updated_at)) or 0


def announce(session: Session, principal: Principal, job_id: int, url: str) -> Job:
    """A replica says where it listens: only with its own job's token, and only an address of
    the node it was placed on (else any caller could make the router fetch any URL)."""
    if principal.job_id != job_id:
        raise Forbidden(f"only replica {job_id} itself (with its job's token) may say where it listens")
    job = jobs.get_job(session, principal, job_id)
    if job.kind != "serve":
        raise Conflict(f"job {job_id} is not a deployment replica")
    if job.state != JobState.RUNNING:
        raise Conflict(f"job {job_id} is {job.state}; only a running replica takes traffic")
    m = URL_RE.match(url or "")
    if not m:
        raise InvalidRequest(f"url {url!r} must look like http://HOST:PORT")
    nodes = {w["node"] for w in job.placed_workers}
    allowed = {n.address for n in session.scalars(select(Node).where(Node.name.in_(nodes)))}
    if m.group("host").strip("[]") not in allowed:
        raise Forbidden(f"a replica listens on its node's address ({', '.join(sorted(allowed)) or 'none'}), "
                        f"not {m.group('host')}")
    job.endpoint = url
    jobs.add_event(session, job, "serving", f"listening on {url}")
    return job


# -- keys ----------------------------------------------------------------------------------

def create_key(session: Session, principal: Principal, name: str, label: str = "") -> tuple[DeploymentKey, str]:
    dep = get(session, principal, name)
    secret = KEY_PREFIX + new_secret()
    key = DeploymentKey(deployment_id=dep.id, name=label[:128], key_hash=hash_secret(secret))
    session.add(key)
    session.flush()
    return key, secret


def list_keys(session: Session, principal: Principal, name: str) -> list[DeploymentKey]:
    dep = get(session, principal, name)
    return list(session.scalars(select(DeploymentKey).where(DeploymentKey.deployment_id == dep.id)
                                .order_by(DeploymentKey.id)))


def revoke_key(session: Session, principal: Principal, name: str, key_id: int) -> DeploymentKey:
    dep = get(session, principal, name)
    key = session.get(DeploymentKey, key_id)
    if key is None or key.deployment_id != dep.id:
        raise NotFound(f"deployment {name!r} has no key {key_id}: see 'deeppod deploy keys {name}'")
    key.revoked_at = key.revoked_at or utcnow()
    return key


def active_keys(session: Session) -> dict[str, int]:
    """key hash -> deployment id, for the router."""
    return dict(session.execute(select(DeploymentKey.key_hash, DeploymentKey.deployment_id)
                                .where(DeploymentKey.revoked_at.is_(None))).all())


def describe(session: Session, dep: Deployment) -> dict:
    """Plain figures for the API: the model, versions, replicas and their jobs."""
    model = session.get(Model, dep.model_id)
    version = session.get(ModelVersion, dep.version_id)
    previous = version_of(session, dep.previous_version_id)
    numbers = {v.id: v.version for v in models.versions(session, model)}
    return {"model": model.name, "version": version.version, "signature": version.signature,
            "previous_version": previous.version if previous else None,
            "replica_jobs": [{"job_id": j.id, "version": numbers.get(j.model_version_id, 0), "state": j.state,
                              "endpoint": j.endpoint, "restarts": j.restart_count} for j in replicas(session, dep)]}

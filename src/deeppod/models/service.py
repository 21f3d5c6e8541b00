"""Models through the store: register, list, aliases, compare (as a job), promote."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from deeppod import nofollow, refs
from deeppod.auth import roles, scope
from deeppod.auth.paths import TenantRoots
from deeppod.auth.service import Principal, check_name
from deeppod.contract import ACTIVE_STATES, JobState, model_env_key
from deeppod.errors import Conflict, Forbidden, InvalidRequest, NotFound
from deeppod.job_folder import JobFolder
from deeppod.job_spec import JobSpec
from deeppod.jobs import quotas
from deeppod.jobs import service as jobs
from deeppod.models import artifacts
from deeppod.models.compare import Figures, verdict
from deeppod.refs import Ref
from deeppod.store.models import (
    Deployment,
    Job,
    JobMetric,
    Model,
    ModelComparison,
    ModelEvaluation,
    ModelVersion,
    Tenant,
    User,
)

log = logging.getLogger(__name__)
MAX_EVALUATION_BYTES = 16 << 20  # a comparison's figures: per class, for two versions
ALIAS_RE = re.compile(r"^[a-z][a-z0-9._-]{0,31}$")
CHAMPION, CHALLENGER = "champion", "challenger"


def parse_ref(ref: str) -> Ref:
    """A model reference: its selector is a version number, an alias, 'latest' or None (latest)."""
    return refs.parse_ref(ref, "NAME, NAME@VERSION or NAME@ALIAS (e.g. digits@3, digits@champion)")


def check_alias(alias: str) -> str:
    if not ALIAS_RE.match(alias or "") or alias == "latest":
        raise InvalidRequest(f"alias {alias!r} is not valid: use a lowercase word starting with a letter "
                             "(champion, challenger, staging, ...); 'latest' and numbers are taken")
    return alias


# -- lookups -----------------------------------------------------------------------------

def get_model(session: Session, principal: Principal, ref: Ref | str) -> Model:
    """Models belong to a tenant; administrators may name another tenant's as TENANT/NAME."""
    ref = parse_ref(ref) if isinstance(ref, str) else ref
    q = select(Model).where(Model.name == ref.name)
    if ref.owner and ref.owner != principal.tenant:
        tenant = session.scalar(select(Tenant).where(Tenant.name == ref.owner))
        if tenant is None or not principal.is_admin:
            raise NotFound(f"no model {ref.owner}/{ref.name} that you can see: list yours with 'deeppod models ls'")
        q = scope.visible(q, Model, principal).where(Model.tenant_id == tenant.id)
    else:
        q = scope.own(q, Model, principal)
    model = session.scalar(q)
    if model is None:
        raise NotFound(f"no model {ref.name!r} in tenant {ref.owner or principal.tenant}: list them with "
                       "'deeppod models ls', or register one with 'deeppod models register NAME --from-job ID'")
    return model


def versions(session: Session, model: Model) -> list[ModelVersion]:
    return list(session.scalars(select(ModelVersion).where(ModelVersion.model_id == model.id)
                                .order_by(ModelVersion.version)))


def resolve(session: Session, model: Model, selector: str | None) -> ModelVersion:
    """A version number, an alias, or the latest."""
    q = select(ModelVersion).where(ModelVersion.model_id == model.id)
    if selector is None or selector == "latest":
        v = session.scalar(q.order_by(ModelVersion.version.desc()).limit(1))
        if v is None:
            raise NotFound(f"model {model.name!r} has no versions yet")
        return v
    if selector.lstrip("v").isdigit():
        number = int(selector.lstrip("v"))
    elif selector in model.aliases:
        number = model.aliases[selector]
    else:
        known = ", ".join(sorted(model.aliases)) or "none yet"
        raise NotFound(f"model {model.name!r} has no version or alias {selector!r} (aliases: {known})")
    v = session.scalar(q.where(ModelVersion.version == number))
    if v is None:
        raise NotFound(f"model {model.name!r} has no version {number}: see 'deeppod models show {model.name}'")
    return v


def get_version(session: Session, principal: Principal, ref: str) -> tuple[Model, ModelVersion]:
    r = parse_ref(ref)
    model = get_model(session, principal, r)
    return model, resolve(session, model, r.selector)


def resolve_for_job(session: Session, principal: Principal, refs: list[str], *, root: Path) -> list[dict]:
    """A job's models (NAME[@VERSION or @ALIAS]), pinned to versions at submit: what it reads,
    read-only, from ``root`` (the registry's folder), in DEEPPOD_MODEL_<NAME>."""
    out, keys = [], set()
    for ref in refs:
        model, v = get_version(session, principal, ref)
        key = model_env_key(model.name)
        if key in keys:
            raise InvalidRequest(f"two models called {model.name!r} in one job: name each once")
        keys.add(key)
        out.append({"ref": f"{model.name}@{v.version}", "version_id": v.id, "env": key, "path": str(root / v.key)})
    return out


# -- register ----------------------------------------------------------------------------

def _job_metrics(session: Session, job_id: int) -> dict[str, float]:
    """The last value of every metric the job reported."""
    last = (select(JobMetric.name, func.max(JobMetric.step).label("step"))
            .where(JobMetric.job_id == job_id).group_by(JobMetric.name).subquery())
    rows = session.execute(select(JobMetric.name, JobMetric.value)
                           .join(last, (JobMetric.name == last.c.name) & (JobMetric.step == last.c.step))
                           .where(JobMetric.job_id == job_id))
    return {name: value for name, value in rows if value is not None}


def register(session: Session, principal: Principal, name: str, *, root: Path, jobs_dir: Path,
             job_id: int | None = None, path: str | None = None, description: str | None = None,
             aliases: list[str] | tuple = (), roots: TenantRoots | None = None) -> tuple[Model, ModelVersion]:
    """A new immutable version from a job's artifact (JOB_DIR/model) or an artifact folder.
    ``roots``: where this server lets the tenant name folders (sandbox isolation; None: anywhere)."""
    check_name("model", name)
    for a in aliases:
        check_alias(a)
    if principal.job_id is not None and principal.scope != roles.NOTEBOOK and job_id != principal.job_id:
        raise Forbidden("a job's token registers only that job's own model (job_id must be its own)")
    job = jobs.get_job(session, principal, job_id) if job_id is not None else None
    if job is None and not path:
        raise InvalidRequest("say where the model is: --from-job JOB_ID (its JOB_DIR/model) or --path FOLDER")
    if job is not None and job.state in (JobState.FAILED, JobState.CANCELLED) and not path:
        raise Conflict(f"job {job.id} {job.state} ({job.reason}); register a job that finished its model")
    if path and not Path(path).is_absolute():
        raise InvalidRequest(f"--path {path!r} must be an absolute folder on the server")
    own_output = job is not None and path and os.path.realpath(path) == os.path.realpath(JobFolder.of(jobs_dir,
                                                                                                      job.id).model)
    if path and roots is not None and not own_output:  # before anything looks at it: say nothing of what exists
        path = roots.check("--path", path, principal.tenant)
    source = Path(path) if path else JobFolder.of(jobs_dir, job.id).model
    if not path and source.is_symlink():
        raise InvalidRequest(f"job {job.id}'s model folder is a link; register a folder the job wrote")
    artifacts.read_signature(source)  # a bad artifact is refused before anything is recorded
    model = session.scalar(scope.own(select(Model).where(Model.name == name), Model, principal))
    if model is None:
        model = Model(tenant_id=principal.tenant_id, name=name, created_by=principal.user_id,
                      description=description or "")
        session.add(model)
        session.flush()
    elif description is not None:
        model.description = description
    number = (session.scalar(select(func.max(ModelVersion.version)).where(ModelVersion.model_id == model.id)) or 0) + 1
    key = f"{principal.tenant}/{name}/v{number}"
    dest = root / key
    if dest.exists():  # left by a crash between the copy and the commit: never registered
        shutil.rmtree(dest)
    art = artifacts.take_in(source, dest, quotas.quota_left(session, principal.tenant))  # as checked and hashed
    sig = art.signature
    metrics = {k: v for k, v in (sig.get("metrics") or {}).items() if isinstance(v, (int, float))}
    lineage = {"source": str(source), "registered_by": principal.user, "dataset": sig.get("dataset"),
               "hyperparameters": sig.get("hyperparameters") or {}, "command": sig.get("command")}
    if job is not None:
        # the artifact's own scores describe the model (the built-in trainer's, on its validation
        # set); the job's last reports are of its last training step (a batch's accuracy): those
        # only stand in where the artifact says nothing
        metrics = metrics or _job_metrics(session, job.id)
        lineage.update(job_id=job.id, job_name=job.name, command=job.command,
                       datasets=[d["ref"] for d in job.datasets or []])
    version = ModelVersion(model_id=model.id, version=number, key=key, signature=sig, metrics=metrics,
                           lineage=lineage, bytes=art.bytes, sha256=art.sha256, created_by=principal.user_id)
    session.add(version)
    session.flush()
    if aliases:
        model.aliases = {**model.aliases, **{a: number for a in aliases}}
    log.info("model %s/%s@%d registered from %s", principal.tenant, name, number, source)
    return model, version


# -- catalog -----------------------------------------------------------------------------

def list_models(session: Session, principal: Principal) -> list[tuple[Model, list[ModelVersion]]]:
    q = scope.visible(select(Model).order_by(Model.name), Model, principal)
    return [(m, versions(session, m)) for m in session.scalars(q)]


def owner_names(session: Session, model: Model) -> tuple[str, str]:
    """Its owner (the tenant, as for datasets and in TENANT/NAME references) and the user who created it."""
    return session.get(Tenant, model.tenant_id).name, session.get(User, model.created_by).name


def evaluations(session: Session, model: Model, job_id: int | None = None) -> list[ModelEvaluation]:
    q = select(ModelEvaluation).where(ModelEvaluation.model_id == model.id)
    if job_id is not None:
        q = q.where(ModelEvaluation.job_id == job_id)
    return list(session.scalars(q.order_by(ModelEvaluation.id)))


def set_alias(session: Session, principal: Principal, name: str, alias: str, selector: str | None) -> Model:
    """Point ``alias`` at a version; ``selector`` None removes it."""
    model = get_model(session, principal, name)
    check_alias(alias)
    aliases = dict(model.aliases)
    if selector is None:
        if alias not in aliases:
            raise NotFound(f"model {name!r} has no alias {alias!r}")
        del aliases[alias]
    else:
        aliases[alias] = resolve(session, model, selector).version
    model.aliases = aliases
    return model


# -- removal ------------------------------------------------------------------------------

def remove(session: Session, principal: Principal, ref: str, *, root: Path) -> list[int]:
    """Delete one version (NAME@V or NAME@ALIAS), or the whole model (NAME): rows, artifacts,
    figures and aliases. Refused while a deployment serves any of them. Returns the numbers removed."""
    r = parse_ref(ref)
    model = get_model(session, principal, r)  # the caller's tenant's (admins: TENANT/NAME)
    doomed = versions(session, model) if r.selector is None else [resolve(session, model, r.selector)]
    ids = {v.id for v in doomed}
    deps = select(Deployment.name).where(Deployment.model_id == model.id)
    if r.selector is not None:  # one version: only deployments that serve it, or still run replicas of it
        replicas_of = select(Job.deployment_id).where(Job.model_version_id.in_(ids),
                                                      Job.state.in_(ACTIVE_STATES))
        deps = deps.where(Deployment.version_id.in_(ids) | Deployment.id.in_(replicas_of))
    serving = list(session.scalars(deps))
    if serving:
        raise Conflict(f"deployment {', '.join(sorted(serving))} serves {ref}: move it to another version "
                       f"('deeppod deploy update NAME --version V') or remove it ('deeppod deploy rm NAME') first")
    for job in session.scalars(select(Job).where(Job.model_version_id.in_(ids))):
        job.model_version_id = None  # finished replicas keep their record, not the reference
    for row in session.scalars(select(ModelEvaluation).where(ModelEvaluation.version_id.in_(ids))):
        session.delete(row)
    for row in session.scalars(select(ModelComparison).where(
            ModelComparison.version_a_id.in_(ids) | ModelComparison.version_b_id.in_(ids))):
        session.delete(row)
    numbers = sorted(v.version for v in doomed)
    model.aliases = {a: n for a, n in model.aliases.items() if n not in numbers}
    folders = [root / v.key for v in doomed]
    for v in doomed:
        session.delete(v)
    session.flush()  # versions before their model; rows before files: a failure leaves the artifacts
    if r.selector is None:
        session.delete(model)
        session.flush()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    log.info("model %s: removed versions %s", model.name, numbers)
    return numbers


# -- compare and promote -----------------------------------------------------------------

def check_image_model(name: str, version: ModelVersion, what: str) -> None:
    """Serving and held-out evaluation run image models for now; a language model is refused by name."""
    if (version.signature or {}).get("kind") == "causal-lm":
        raise InvalidRequest(f"{name}@{version.version} is a language model ({version.signature['architecture']}); "
                             f"{what} runs image models for now")


def compare(session: Session, principal: Principal, name: str, a: str, b: str, dataset: str, *,
            root: Path, jobs_dir: Path, default_grace: float) -> tuple[Job, ModelVersion, ModelVersion]:
    """Evaluate two versions on the same held-out data, as a job; its figures land in the
    registry when it ends (absorb_evaluation)."""
    model = get_model(session, principal, name)
    va, vb = resolve(session, model, a), resolve(session, model, b)
    for v in (va, vb):
        check_image_model(name, v, "held-out evaluation")
    if va.id == vb.id:
        raise InvalidRequest(f"{name}@{a} and {name}@{b} are the same version ({va.version}): compare two versions")
    command = [sys.executable, "-m", "deeppod.runtime.evaluate", "--dataset", dataset]
    for v in (va, vb):
        command += ["--model", f"{v.id}:{v.version}={root / v.key}"]
    job = jobs.submit(session, principal, JobSpec(
        command=command, workdir="/", name=f"compare-{name}-v{va.version}-v{vb.version}",
        gpus_per_worker=0, datasets=[dataset]), default_grace=default_grace,  # held-out scoring is light
        read_paths=[str(root / v.key) for v in (va, vb)])  # what its sandbox may read: these two versions
    job.kind = "evaluate"
    job.command = command + ["--output", str(JobFolder.of(jobs_dir, job.id).evaluation)]
    session.add(ModelComparison(job_id=job.id, model_id=model.id, version_a_id=va.id, version_b_id=vb.id,
                                dataset=dataset))
    return job, va, vb


def comparison(session: Session, principal: Principal, name: str, job_id: int
               ) -> tuple[Model, Job, tuple[int, int], list[ModelEvaluation]]:
    """A comparison job, the two version numbers it compares, and its figures once it ended."""
    model = get_model(session, principal, name)
    job = jobs.get_job(session, principal, job_id)
    row = session.get(ModelComparison, job_id)
    if row is None or row.model_id != model.id:
        raise NotFound(f"job {job_id} is not a comparison of model {name!r}: "
                       f"start one with 'deeppod models compare {name} A B --data DATASET@VERSION'")
    numbers = (session.get(ModelVersion, row.version_a_id).version, session.get(ModelVersion, row.version_b_id).version)
    return model, job, numbers, evaluations(session, model, job_id)


def absorb_evaluation(session: Session, job: Job, jobs_dir: Path) -> int:
    """Store a finished comparison job's figures (idempotent); returns how many rows it added.
    The file is the job's (its tenant's identity wrote it): read with no link followed, and
    only figures for the two versions it compares are kept."""
    path = JobFolder.of(jobs_dir, job.id).evaluation
    row = session.get(ModelComparison, job.id)
    data = nofollow.read_small(path, MAX_EVALUATION_BYTES) if job.state == JobState.SUCCEEDED else None
    if row is None or data is None:
        return 0
    try:
        doc = json.loads(data)
        results = [(int(r["version_id"]), int(r["samples"]), float(r["accuracy"]), dict(r.get("per_class") or {}))
                   for r in doc.get("results", [])]
        dataset = str(doc["dataset"])
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning("job %s wrote an unreadable %s", job.id, path)
        return 0
    added = 0
    for version_id, samples, accuracy, per_class in results:
        if version_id not in (row.version_a_id, row.version_b_id):  # not what it was asked to compare
            continue
        version = session.get(ModelVersion, version_id)
        seen = session.scalar(select(ModelEvaluation.id).where(ModelEvaluation.job_id == job.id,
                                                               ModelEvaluation.version_id == version.id))
        if seen is None:
            session.add(ModelEvaluation(model_id=version.model_id, version_id=version.id, job_id=job.id,
                                        dataset=dataset, samples=samples, accuracy=accuracy, per_class=per_class))
            added += 1
    return added


def _latest_head_to_head(session: Session, model: Model, a: ModelVersion, b: ModelVersion
                         ) -> tuple[ModelEvaluation, ModelEvaluation] | None:
    rows = evaluations(session, model)
    by_job: dict[int, dict[int, ModelEvaluation]] = {}
    for e in rows:
        by_job.setdefault(e.job_id, {})[e.version_id] = e
    for job_id in sorted(by_job, reverse=True):
        pair = by_job[job_id]
        if a.id in pair and b.id in pair:
            return pair[a.id], pair[b.id]
    return None


def promote(session: Session, principal: Principal, name: str, selector: str, *, force: bool = False
            ) -> tuple[Model, ModelVersion, str]:
    """Move ``champion`` to the version if it beat the champion in their latest comparison."""
    model = get_model(session, principal, name)
    challenger = resolve(session, model, selector)
    current = model.aliases.get(CHAMPION)
    if current == challenger.version:
        raise Conflict(f"{name}@{challenger.version} is already the champion")
    if current is None:
        why = "there was no champion"
    else:
        champion = resolve(session, model, str(current))
        pair = _latest_head_to_head(session, model, challenger, champion)
        if pair is None:
            why = f"no comparison of v{challenger.version} with champion v{champion.version}"
            if not force:
                raise Conflict(f"{why}: run 'deeppod models compare {name} {champion.version} {challenger.version} "
                               "--data DATASET@VERSION' first, or promote with --force")
        else:
            ec, eo = pair
            wins, why = verdict(Figures(challenger.version, ec.dataset, ec.samples, ec.accuracy),
                                Figures(champion.version, eo.dataset, eo.samples, eo.accuracy))
            if not wins and not force:
                raise Conflict(f"not promoted: {why}; pass --force to promote it anyway")
        if force:
            why += "; forced"
    aliases = dict(model.aliases)
    aliases[CHAMPION] = challenger.version
    if aliases.get(CHALLENGER) == challenger.version:
        del aliases[CHALLENGER]
    model.aliases = aliases
    log.info("model %s: champion is now v%d (%s)", name, challenger.version, why)
    return model, challenger, why

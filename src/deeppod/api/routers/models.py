from __future__ import annotations

from fastapi import APIRouter, Request

from deeppod.api.deps import Id, PrincipalDep, SessionDep, get_ctx
from deeppod.api.schemas.models import (
    AliasIn,
    CompareIn,
    CompareOut,
    ModelOut,
    PromoteIn,
    PromoteOut,
    RegisterIn,
    VersionOut,
    evaluation_out,
    model_out,
    version_out,
)
from deeppod.models import service

router = APIRouter(prefix="/v1/models", tags=["models"])


def _show(session, principal, name: str) -> ModelOut:
    model = service.get_model(session, principal, name)
    return model_out(model, service.owner_names(session, model), service.versions(session, model),
                     service.evaluations(session, model))


@router.post("/{name}/versions", status_code=201, response_model=VersionOut)
def register(name: str, body: RegisterIn, request: Request, session: SessionDep, principal: PrincipalDep) -> VersionOut:
    """A new version from a job's artifact (JOB_DIR/model) or an artifact folder."""
    ctx = get_ctx(request)
    settings = ctx.settings
    model, version = service.register(session, principal, name, root=settings.models_dir,
                                      jobs_dir=settings.jobs_dir, job_id=body.job_id, path=body.path,
                                      description=body.description, aliases=body.aliases, roots=ctx.roots)
    return version_out(model, version, settings.models_dir)


@router.delete("/{ref}")
def remove(ref: str, request: Request, session: SessionDep, principal: PrincipalDep) -> dict:
    """NAME@VERSION (or @ALIAS) removes one version; NAME the whole model."""
    return {"removed": service.remove(session, principal, ref, root=get_ctx(request).settings.models_dir)}


@router.get("", response_model=list[ModelOut])
def list_models(session: SessionDep, principal: PrincipalDep) -> list[ModelOut]:
    return [model_out(m, service.owner_names(session, m), vs) for m, vs in service.list_models(session, principal)]


@router.get("/{name}", response_model=ModelOut)
def show(name: str, session: SessionDep, principal: PrincipalDep) -> ModelOut:
    return _show(session, principal, name.split("@")[0])


@router.get("/{ref}/version", response_model=VersionOut)
def show_version(ref: str, request: Request, session: SessionDep, principal: PrincipalDep) -> VersionOut:
    """One version, by NAME@VERSION or NAME@ALIAS."""
    model, version = service.get_version(session, principal, ref)
    return version_out(model, version, get_ctx(request).settings.models_dir)


@router.put("/{name}/aliases/{alias}", response_model=ModelOut)
def set_alias(name: str, alias: str, body: AliasIn, session: SessionDep, principal: PrincipalDep) -> ModelOut:
    service.set_alias(session, principal, name, alias, body.version)
    return _show(session, principal, name)


@router.post("/{name}/comparisons", status_code=201, response_model=CompareOut)
def compare(name: str, body: CompareIn, request: Request, session: SessionDep, principal: PrincipalDep) -> CompareOut:
    """Evaluate two versions on the same data, as a job; poll GET .../comparisons/{job_id}."""
    settings = get_ctx(request).settings
    job, va, vb = service.compare(session, principal, name, body.a, body.b, body.data, root=settings.models_dir,
                                  jobs_dir=settings.jobs_dir, default_grace=settings.grace_seconds)
    return CompareOut(job_id=job.id, a=va.version, b=vb.version, data=body.data, state=job.state, evaluations=[])


@router.get("/{name}/comparisons/{job_id}", response_model=CompareOut)
def comparison(name: str, job_id: Id, session: SessionDep, principal: PrincipalDep) -> CompareOut:
    model, job, numbers, evals = service.comparison(session, principal, name, job_id)
    by_id = {v.id: v.version for v in service.versions(session, model)}
    return CompareOut(job_id=job.id, a=numbers[0], b=numbers[1], data=(job.datasets or [{}])[0].get("ref", ""),
                      state=job.state, evaluations=[evaluation_out(e, by_id.get(e.version_id, 0)) for e in evals])


@router.post("/{name}/promote", response_model=PromoteOut)
def promote(name: str, body: PromoteIn, session: SessionDep, principal: PrincipalDep) -> PromoteOut:
    model, version, why = service.promote(session, principal, name, body.version, force=body.force)
    return PromoteOut(model=model.name, champion=version.version, reason=why)

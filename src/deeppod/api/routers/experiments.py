from __future__ import annotations

from collections import Counter

from fastapi import APIRouter, Request

from deeppod.api.deps import Id, PrincipalDep, SessionDep, get_ctx
from deeppod.api.schemas.experiments import ExperimentCreate, ExperimentOut, HostTrialIn, HostTrialOut, experiment_out
from deeppod.experiments import service

router = APIRouter(prefix="/v1/experiments", tags=["experiments"])
# a search's process that runs trial after trial (runtime.trials()), with its job's token
host_router = APIRouter(prefix="/v1/jobs/{job_id}/trial", tags=["experiments"])


def _show(session, principal, name: str, tenant: str | None = None) -> ExperimentOut:
    exp = service.get_experiment(session, principal, name, tenant)
    rows = service.trials(session, exp)
    counts = dict(Counter(t.state for t, _ in rows))
    return experiment_out(exp, *service.owner_names(session, exp), counts, service.best(session, exp), rows)


@router.post("", status_code=201, response_model=ExperimentOut)
def create(body: ExperimentCreate, request: Request, session: SessionDep, principal: PrincipalDep) -> ExperimentOut:
    """A hyperparameter search: its first trial is submitted now, the rest as room allows."""
    req = service.ExperimentRequest(**body.model_dump(exclude={"job", "register_as"}), register=body.register_as,
                                    job=body.job.model_dump())
    exp = service.create(session, principal, req, get_ctx(request).experiments.launcher)
    return _show(session, principal, exp.name)


@router.get("", response_model=list[ExperimentOut])
def list_experiments(session: SessionDep, principal: PrincipalDep) -> list[ExperimentOut]:
    return [experiment_out(e, t, u, c, service.best(session, e)) for e, t, u, c in
            service.list_experiments(session, principal)]


@router.get("/{name}", response_model=ExperimentOut)
def show(name: str, session: SessionDep, principal: PrincipalDep, tenant: str | None = None) -> ExperimentOut:
    return _show(session, principal, name, tenant)


@router.post("/{name}/stop", response_model=ExperimentOut)
def stop(name: str, session: SessionDep, principal: PrincipalDep) -> ExperimentOut:
    service.stop(session, principal, name)
    return _show(session, principal, name)


@router.post("/{name}/resume", response_model=ExperimentOut)
def resume(name: str, session: SessionDep, principal: PrincipalDep) -> ExperimentOut:
    service.resume(session, principal, name)
    return _show(session, principal, name)


@host_router.post("", response_model=HostTrialOut, response_model_exclude_none=True)
def next_trial(job_id: Id, body: HostTrialIn, request: Request, session: SessionDep,
               principal: PrincipalDep) -> HostTrialOut:
    """The trial this job's process runs next, once it says which one it ended."""
    out = HostTrialOut(**service.host_trial(session, principal, job_id, body.done, body.kept, body.turn))
    if body.done is not None or out.wait:
        get_ctx(request).experiments.hurry.set()  # the controller's next round now: it ends one, gives one
    return out


@host_router.get("/{number}", response_model=HostTrialOut, response_model_exclude_none=True)
def trial_state(job_id: Id, number: int, session: SessionDep, principal: PrincipalDep) -> HostTrialOut:
    """Whether trial ``number`` still runs (the process asks if a pruner stopped it)."""
    return HostTrialOut(number=number, state=service.trial_state(session, principal, job_id, number))

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from deeppod.api.deps import Id, PrincipalDep, SessionDep, get_ctx, submit_options
from deeppod.api.schemas.notebooks import NotebookCreate, NotebookOut, NotebookResume, notebook_out
from deeppod.jobs import service as jobs
from deeppod.notebooks import service

router = APIRouter(prefix="/v1/notebooks", tags=["notebooks"])


@router.post("", status_code=201, response_model=NotebookOut)
def start(body: NotebookCreate, session: SessionDep, principal: PrincipalDep, request: Request) -> NotebookOut:
    """Start JupyterLab as a job of kind notebook: it queues as any job; open its url once running."""
    job = service.start(session, principal, service.NotebookStart(**body.model_dump()),
                        idle_default=get_ctx(request).settings.notebook_idle_seconds, **submit_options(request))
    return notebook_out(job, principal.tenant, principal.user)


@router.get("", response_model=list[NotebookOut])
def list_notebooks(session: SessionDep, principal: PrincipalDep,
                   limit: int = Query(200, ge=1, le=10000)) -> list[NotebookOut]:
    return [notebook_out(j, t, u) for j, t, u in service.list_notebooks(session, principal, limit=limit)]


@router.get("/{job_id}", response_model=NotebookOut)
def get_notebook(job_id: Id, session: SessionDep, principal: PrincipalDep) -> NotebookOut:
    job = service.get_notebook(session, principal, job_id)
    return notebook_out(job, *jobs.owner_names(session, job))


@router.post("/{job_id}/stop", response_model=NotebookOut)
def stop(job_id: Id, session: SessionDep, principal: PrincipalDep) -> NotebookOut:
    """Stop it, resumable: its folder and every file in it are kept."""
    job = service.stop(session, principal, job_id)
    return notebook_out(job, *jobs.owner_names(session, job))


@router.post("/{job_id}/resume", response_model=NotebookOut)
def resume(job_id: Id, session: SessionDep, principal: PrincipalDep, request: Request,
           body: NotebookResume | None = None) -> NotebookOut:
    """A stopped notebook back in the queue, same id and files."""
    job = service.resume(session, principal, job_id, idle_default=get_ctx(request).settings.notebook_idle_seconds,
                         idle_seconds=body.idle_seconds if body else None)
    return notebook_out(job, *jobs.owner_names(session, job))

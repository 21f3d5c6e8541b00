from __future__ import annotations

import sys
from datetime import timedelta

from fastapi import APIRouter, Query, Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from deeppod.api import terminal
from deeppod.api.deps import Id, PrincipalDep, SessionDep, bearer, get_ctx, submit_options
from deeppod.api.schemas.jobs import JobCreate, JobEventOut, JobOut, JobSpecOut, PurgeIn, PurgeOut, job_out
from deeppod.audit.log import Entry
from deeppod.errors import Conflict, DeepPodError, InvalidRequest
from deeppod.job_folder import JobFolder
from deeppod.job_spec import JobSpec
from deeppod.jobs import fit, retention, service, spec
from deeppod.jobs.logs import logged_ranks, stream_logs
from deeppod.jobs.shell import target as shell_target

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=201, response_model=JobOut)
def submit(body: JobCreate, session: SessionDep, principal: PrincipalDep, request: Request) -> JobOut:
    req = JobSpec(**body.model_dump())
    job = service.submit(session, principal, req, **submit_options(request))
    return job_out(job, principal.tenant, principal.user).model_copy(update={"warning": fit.warning(session, job)})


@router.get("", response_model=list[JobOut])
def list_jobs(session: SessionDep, principal: PrincipalDep, state: str | None = None,
              limit: int = Query(200, ge=1, le=10000),
              kind: str | None = Query(None, description="only these kinds, comma-separated: batch, serve, "
                                                         "evaluate, trial, notebook"),
              exclude_kind: str | None = Query(None, description="not these kinds, comma-separated"),
              tenant: str | None = None, user: str | None = None,
              name: str | None = Query(None, description="jobs whose name contains this")) -> list[JobOut]:
    where = service.JobFilter(state=state, kinds=_csv(kind), exclude_kinds=_csv(exclude_kind), tenant=tenant,
                              user=user, name=name)
    return [job_out(j, t, u) for j, t, u in service.list_jobs(session, principal, limit=limit, where=where)]


def _csv(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


@router.get("/{job_id}", response_model=JobOut)
def show(job_id: Id, session: SessionDep, principal: PrincipalDep) -> JobOut:
    job = service.get_job(session, principal, job_id)
    return job_out(job, *service.owner_names(session, job))


@router.get("/{job_id}/spec", response_model=JobSpecOut)
def job_spec(job_id: Id, session: SessionDep, principal: PrincipalDep, request: Request) -> JobSpecOut:
    job = service.get_job(session, principal, job_id)
    own = str(JobFolder.of(get_ctx(request).settings.jobs_dir, job_id).code)
    return JobSpecOut(fields=spec.fields_of(job, own), yaml=spec.spec_text(job, own))


@router.post("/{job_id}/cancel", response_model=JobOut)
def cancel(job_id: Id, session: SessionDep, principal: PrincipalDep) -> JobOut:
    job = service.cancel(session, principal, job_id)
    return job_out(job, *service.owner_names(session, job))


@router.post("/{job_id}/stop", response_model=JobOut)
def stop(job_id: Id, session: SessionDep, principal: PrincipalDep) -> JobOut:
    job = service.stop(session, principal, job_id)
    return job_out(job, *service.owner_names(session, job))


@router.post("/{job_id}/resume", response_model=JobOut)
def resume(job_id: Id, session: SessionDep, principal: PrincipalDep) -> JobOut:
    job = service.resume(session, principal, job_id)
    return job_out(job, *service.owner_names(session, job))


@router.delete("/{job_id}/files", response_model=PurgeOut)
def remove_files(job_id: Id, session: SessionDep, principal: PrincipalDep, request: Request,
                 force: bool = False) -> PurgeOut:
    freed = retention.purge(session, principal, job_id, get_ctx(request).settings.jobs_dir, force=force)
    return PurgeOut(jobs=[job_id], bytes_freed=freed)


@router.post("/purge", response_model=PurgeOut)
def purge(body: PurgeIn, session: SessionDep, principal: PrincipalDep, request: Request) -> PurgeOut:
    ids, freed = retention.purge_finished(session, principal, get_ctx(request).settings.jobs_dir,
                                          older_than=timedelta(seconds=body.older_than_seconds))
    return PurgeOut(jobs=ids, bytes_freed=freed)


@router.get("/{job_id}/events", response_model=list[JobEventOut])
def events(job_id: Id, session: SessionDep, principal: PrincipalDep) -> list[JobEventOut]:
    return [JobEventOut.model_validate(e) for e in service.list_events(session, principal, job_id)]


@router.get("/{job_id}/logs", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {}},
                              "description": "the ranks' lines, each as its rank wrote it"},
                       409: {"description": "its files, its logs with them, were removed (retention, jobs rm)",
                             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}})
def logs(job_id: Id, principal: PrincipalDep, request: Request, follow: bool = False,
         rank: int | None = Query(None, ge=0)) -> StreamingResponse:
    ctx = get_ctx(request)
    job_dir = JobFolder.of(ctx.settings.jobs_dir, job_id).root
    with ctx.read_sessions() as session:
        job = service.get_job(session, principal, job_id)
        current = len(job.placed_workers) or job.workers
        if job.purged_at is not None:
            raise Conflict(f"job {job_id}'s files, its logs with them, were removed on {job.purged_at:%Y-%m-%d %H:%M}")
    known = logged_ranks(job_dir, current)
    if rank is not None and rank not in known:
        raise InvalidRequest(f"job {job_id} has ranks 0..{max(known)}; --rank {rank} does not exist")

    def finished() -> bool:
        with ctx.read_sessions() as s:
            return service.is_finished(s, job_id)

    ranks = [rank] if rank is not None else known
    body = stream_logs(job_dir, ranks, follow=follow, finished=finished)
    return StreamingResponse(body, media_type="text/plain; charset=utf-8")


@router.websocket("/{job_id}/shell")
async def shell(websocket: WebSocket, job_id: int, rank: int = 0, rows: int = 24, cols: int = 80,
                argv: list[str] = Query(default_factory=list)) -> None:
    """A terminal inside rank ``rank``'s sandbox (``deeppod shell``; ``argv``: one command, ``deeppod
    exec``), as the job's identity; its owner or an administrator (api/terminal.py: the messages)."""
    ctx = websocket.app.state.ctx
    token = bearer(websocket)

    def find() -> tuple[int, object]:
        principal = ctx.principals.get(token)
        with ctx.read_sessions() as s:
            return shell_target(s, principal, job_id, rank, ctx.settings.jobs_dir), principal
    try:
        pid, principal = await run_in_threadpool(find)
    except DeepPodError as exc:
        await websocket.send_denial_response(JSONResponse({"error": {"code": exc.code, "message": exc.message}},
                                                          status_code=exc.status))
        return
    client = websocket.client
    ctx.audit.record(Entry("WEBSOCKET", f"{websocket.url.path} {' '.join(argv) or '(shell)'}"[:512], 101,
                           client.host[:64] if client else "", principal.user, principal.tenant, "user"))
    await websocket.accept()
    command = [sys.executable, "-m", "deeppod.executor.enter", str(pid), *(["--", *argv] if argv else [])]
    await terminal.relay(websocket, command, rows, cols)

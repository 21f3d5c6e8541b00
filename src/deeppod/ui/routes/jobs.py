"""Console pages for jobs: the list, a job's page (live charts, logs, events, stop / resume /
cancel), the submit form and the built-in trainer's form. Each calls the jobs service the
API calls, with the same checks."""

from __future__ import annotations

import math
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from deeppod.api.deps import Id, SessionDep, get_ctx, submit_options
from deeppod.api.schemas.jobs import JobCreate, job_out
from deeppod.contract import FINAL_STATES, JobState
from deeppod.datasets import service as datasets
from deeppod.envs import images
from deeppod.errors import DeepPodError, InvalidRequest, Rerender
from deeppod.experiments import service as experiments
from deeppod.job_folder import JobFolder
from deeppod.job_spec import JobSpec
from deeppod.jobs import fit, metrics, service, spec
from deeppod.jobs.logs import logged_ranks, tail
from deeppod.monitor import service as monitoring
from deeppod.runtime.trainers import command as trainer
from deeppod.ui import forms
from deeppod.ui.auth import ViewerDep
from deeppod.ui.render import ConsoleRoute, fragment, page, page_number

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

PAGE_SIZE = 50
STATES = [s.value for s in JobState]
MODELS = ("auto", "small-cnn", "resnet18", "resnet34", "resnet50", "mobilenet_v3_small", "efficientnet_b0")
OPTIMIZERS = ("momentum", "sgd", "nesterov", "adam", "adamw", "adagrad", "adadelta", "rmsprop")
SUBMIT_FIELDS = {"command": "command", "name": "name", "workers": "workers", "max_workers": "workers",
                 "gpus_per_worker": "gpus_per_worker", "cpus_per_worker": "cpus_per_worker",
                 "memory_mb_per_worker": "memory_mb", "gpu_memory_mb": "gpu_memory_mb", "env": "env",
                 "priority": "priority",
                 "max_restarts": "max_restarts", "datasets": "datasets", "models": "models", "workdir": "workdir",
                 "grace_seconds": "grace_seconds", "time_limit_seconds": "time", "requirements": "requirements",
                 "python": "python",
                 "network": "network", "image": "image"}
# words in a service's refusal -> the field it is about
# The job fields the submit form has no input for, and why (tests/test_job_spec.py holds the
# form and these to job_spec.JobSpec).
FORM_LEAVES_OUT = {
    "code": "a form's job runs in a folder on the server or in its own; code is sent by the CLI and the SDK",
    "preemptible": "a job from the form may be preempted; 'deeppod submit --no-preemptible' makes one that may not",
    "pids_per_worker": "the tenant's plan (or the server's default) bounds a form's job's processes",
    "stop_rules": "stop rules are written with 'deeppod submit --stop-on-nan/--stop-patience' or in a spec file",
}
SERVICE_FIELDS = {"each gpu must have": "gpu_memory_mb", "gpus of": "gpu_memory_mb", "image": "image",
                  "requirements": "requirements", "install from": "requirements", "is not a version": "python",
                  "network": "network",
                  "dataset": "datasets", "model": "models", "working directory": "workdir", "workdir": "workdir",
                  "gpu": "gpus_per_worker",
                  "cpu": "cpus_per_worker", "memory": "memory_mb", "worker": "workers", "environment": "env",
                  "env": "env", "command": "command", "executable": "command", "name": "name"}


@router.get("/")
def home(viewer: ViewerDep) -> Response:
    return RedirectResponse("/jobs", status_code=303)


@router.get("/jobs")
def jobs(request: Request, session: SessionDep, viewer: ViewerDep, state: str = "", name: str = "", user: str = "",
         tenant: str = "", kind: str = "", sort: str = "-id") -> Response:
    number = page_number(request)
    where = service.JobFilter(state=state or None, kinds=(kind,) if kind else (), tenant=tenant or None,
                              user=user or None, name=name or None)
    total = service.count_jobs(session, viewer.principal, where)
    rows = service.list_jobs(session, viewer.principal, where, limit=PAGE_SIZE, offset=(number - 1) * PAGE_SIZE,
                             sort=sort)
    filters = {"state": state, "name": name, "user": user, "tenant": tenant, "kind": kind}
    values = dict(rows=rows, total=total, page_no=number, pages=max(1, math.ceil(total / PAGE_SIZE)), sort=sort,
                  filters=filters, states=STATES, kinds=service.JOB_KINDS,
                  link=lambda **kw: "/jobs?" + urlencode({k: v for k, v in {**filters, "sort": sort,
                                                                             "page": number, **kw}.items() if v}))
    if request.headers.get("hx-target") == "jobs-table":
        return fragment("jobs_table.html", **values)
    return page(request, "jobs.html", **values)


# -- submit (before /jobs/{job_id}: 'new' is not an id) ----------------------------------
def _submit_page(request: Request, status: int = 200, **values) -> Response:
    settings = get_ctx(request).settings
    return page(request, "submit.html", status=status, networks=service.NETWORKS, default_network=settings.job_network,
                images=list(images.offered(settings.image_dir)), **values)


@router.get("/jobs/new")
def submit_form(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    return _submit_page(request, values={"workers": "1"}, errors={})


@router.post("/jobs/new")
def submit(request: Request, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("POST", "/v1/jobs")
    errors: dict[str, str] = {}
    low, high = forms.workers(errors, "workers", form.get("workers"))
    body = {"command": forms.command(errors, "command", form.get("command")),
            "name": forms.blank_none(form.get("name")),
            "workers": low, "max_workers": high,
            "gpus_per_worker": forms.number(errors, "gpus_per_worker", form.get("gpus_per_worker")),
            "cpus_per_worker": forms.number(errors, "cpus_per_worker", form.get("cpus_per_worker"), float),
            "memory_mb_per_worker": forms.number(errors, "memory_mb", form.get("memory_mb")),
            "gpu_memory_mb": forms.number(errors, "gpu_memory_mb", form.get("gpu_memory_mb")),
            "env": forms.env_lines(errors, "env", form.get("env")),
            "priority": forms.number(errors, "priority", form.get("priority")) or 0,
            "max_restarts": forms.number(errors, "max_restarts", form.get("max_restarts")) or 0,
            "datasets": forms.names(form.get("datasets")), "models": forms.names(form.get("models")),
            "workdir": forms.blank_none(form.get("workdir")),
            "requirements": forms.blank_none(form.get("requirements")), "python": forms.blank_none(form.get("python")),
            "network": forms.blank_none(form.get("network")), "image": forms.blank_none(form.get("image")),
            "time_limit_seconds": forms.time_limit(errors, "time", form.get("time"))}
    try:
        checked = forms.validated(JobCreate, {k: v for k, v in body.items() if v is not None}, errors, SUBMIT_FIELDS)
        job = _submit(request, session, viewer, JobSpec(**checked.model_dump()))
    except forms.FormErrors as exc:  # the request's transaction is rolled back
        raise Rerender(_submit_page(request, status=exc.status, values=form, errors=exc.errors)) from None
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


def _submit(request: Request, session, viewer, req: JobSpec, fields: dict[str, str] = SERVICE_FIELDS):
    try:
        return service.submit(session, viewer.principal, req, **submit_options(request))
    except DeepPodError as exc:
        raise forms.service_error(exc, fields) from None


@router.get("/jobs/new/trainer")
def trainer_form(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    return page(request, "trainer.html", values=TRAINER_DEFAULTS, errors={}, models=MODELS, optimizers=OPTIMIZERS,
                datasets=_dataset_choices(session, viewer))


TRAINER_DEFAULTS = {"model": "auto", "epochs": "10", "lr": "0.1", "optimizer": "momentum",
                    "workers": "1", "max_restarts": "3", "histograms_every": "20"}
TRAINER_FIELDS = {"dataset": "dataset", "model": "model", "epochs": "epochs", "batch": "batch_size",
                  "lr": "lr", "optimizer": "optimizer", "image": "image_size", "worker": "workers",
                  "gpu": "gpus_per_worker", "register": "register", "histogram": "histograms_every"}


def _dataset_choices(session, viewer) -> list[str]:
    return [ds.name for ds, _, _ in datasets.search(session, viewer.principal, "")]


def _gpu_request(session, args: list[str], workers: int, gpus: int | None) -> tuple[list[str], int | None]:
    """As ``deeppod train`` does: on GPUs that say their memory, the way that fits the largest
    and the estimate as the job's request (runtime/trainers/memory.py); a model none holds is refused."""
    from deeppod.cluster.service import capacity
    from deeppod.runtime.trainers.memory import gpu_request

    cap = capacity(session)
    if not (gpus if gpus is not None else cap["gpus"]) or cap["gpu_memory_unknown"]:
        return args, None
    args, _, request = gpu_request(args, workers, largest_mb=cap["max_gpu_memory_mb"] or None, asked_mb=None)
    return args, request


@router.post("/jobs/new/trainer")
def train(request: Request, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("POST", "/v1/jobs")
    errors: dict[str, str] = {}
    dataset = forms.blank_none(form.get("dataset"))
    if dataset is None:
        errors["dataset"] = "choose the dataset to train on ('deeppod data ingest' adds one)"
    model = (form.get("model") or "").strip()
    nums = {f: forms.number(errors, f, form.get(f), kind) for f, kind in
            (("epochs", int), ("batch_size", int), ("lr", float), ("image_size", int), ("histograms_every", int))}
    low, high = forms.workers(errors, "workers", form.get("workers"))
    gpus = forms.number(errors, "gpus_per_worker", form.get("gpus_per_worker"))
    register = forms.blank_none(form.get("register"))
    args = ["--dataset", dataset or "", "--model", model,
            *[a for f, flag in (("epochs", "--epochs"), ("batch_size", "--batch-size"), ("lr", "--lr"),
                                ("image_size", "--image-size"), ("histograms_every", "--histograms-every"))
              if nums[f] is not None for a in (flag, str(nums[f]))],
            "--optimizer", (form.get("optimizer") or "momentum").strip(), *(["--register",
                                                                             register] if register else [])]
    values = dict(values=form, models=MODELS, optimizers=OPTIMIZERS, datasets=_dataset_choices(session, viewer))
    gpu_memory = None
    try:
        if not errors:
            try:
                trainer.check_args(args, model)
            except InvalidRequest as exc:
                raise forms.service_error(exc, TRAINER_FIELDS) from None
            try:
                args, gpu_memory = _gpu_request(session, args, low or 1, gpus)
            except InvalidRequest as exc:  # no GPU of the cluster holds the model: every way's estimate, above the form
                raise forms.FormErrors({forms.FORM_ERROR: exc.message}, exc.status) from None
        body = {"command": trainer.image_classifier(args),
                "name": forms.blank_none(form.get("name")) or ("train-classifier" if model == "auto"
                                                               else f"train-{model}"),
                "workers": low, "max_workers": high, "gpus_per_worker": gpus, "gpu_memory_mb": gpu_memory,
                "max_restarts": forms.number(errors, "max_restarts", form.get("max_restarts")) or 0,
                "datasets": [dataset] if dataset else [], "stop_rules": [{"kind": "nan", "metric": "loss"}]}
        checked = forms.validated(JobCreate, {k: v for k, v in body.items() if v is not None}, errors,
                                  {**SUBMIT_FIELDS, "datasets": "dataset"})
        job = _submit(request, session, viewer, JobSpec(**checked.model_dump()),
                      {**SERVICE_FIELDS, "dataset": "dataset"})
    except forms.FormErrors as exc:
        raise Rerender(page(request, "trainer.html", status=exc.status, errors=exc.errors, **values)) from None
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


# -- one job ---------------------------------------------------------------------------------

def _job_values(session, viewer, job_id: int) -> dict:
    job = service.get_job(session, viewer.principal, job_id)
    out = job_out(job, *service.owner_names(session, job))
    # a queued job that can never start as asked says so here, as the submit answer did
    warning = fit.warning(session, job) if job.state == JobState.QUEUED else None
    return dict(job=out, warning=warning, final=job.state in FINAL_STATES, stoppable=job.state not in FINAL_STATES,
                resumable=job.state == JobState.STOPPED,
                can_change=viewer.can("POST", "/v1/jobs/{job_id}/stop", job_id=job_id))


MAX_COMPARED = 10


def _compared(ids: str) -> list[int]:
    picked = [x.strip() for x in ids.replace(" ", ",").split(",") if x.strip()]
    if not all(x.isdigit() for x in picked):
        raise InvalidRequest(f"ids {ids!r}: give job ids separated by commas, e.g. 12,15,17")
    out = list(dict.fromkeys(int(x) for x in picked))
    if len(out) > MAX_COMPARED:
        raise InvalidRequest(f"{len(out)} jobs: compare at most {MAX_COMPARED} at once")
    return out


@router.get("/jobs/compare")
def compare_page(request: Request, session: SessionDep, viewer: ViewerDep, ids: str = "") -> Response:
    """Runs side by side: several jobs' curves of each metric overlaid (picked on the jobs page)."""
    picked = _compared(ids)
    jobs = [service.get_job(session, viewer.principal, i) for i in picked]
    return page(request, "jobs_compare.html", jobs=jobs, ids=",".join(map(str, picked)))


@router.get("/jobs/compare.json")
def compare_data(session: SessionDep, viewer: ViewerDep, ids: str = "") -> Response:
    """Each metric of each job, with each point's seconds since its job's first report."""
    out: dict[str, dict] = {}
    jobs = []
    for job_id in _compared(ids):
        job = service.get_job(session, viewer.principal, job_id)
        jobs.append({"id": job.id, "name": job.name, "state": job.state.value, "final": job.state in FINAL_STATES})
        for name, m in metrics.job_series(session, job, None, 500, with_time=True)["metrics"].items():
            out.setdefault(name, {})[str(job_id)] = m["series"]
    return JSONResponse({"jobs": jobs, "metrics": out})


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: Id, session: SessionDep, viewer: ViewerDep) -> Response:
    values = _job_values(session, viewer, job_id)
    folder = JobFolder.of(get_ctx(request).settings.jobs_dir, job_id)
    ranks = logged_ranks(folder.root, values["job"].workers)
    job = service.get_job(session, viewer.principal, job_id)
    text = spec.spec_text(job, str(folder.code)) if job.kind == "batch" else None
    search = experiments.search_of(session, job.id) if job.kind == "trial" else None
    return page(request, "job.html", ranks=ranks, spec=text, search=search, **values)


@router.get("/jobs/{job_id}/spec.yaml")
def job_spec(request: Request, job_id: Id, session: SessionDep, viewer: ViewerDep, download: bool = False) -> Response:
    """The job as a spec file (deeppod submit --spec), shown or downloaded."""
    job = service.get_job(session, viewer.principal, job_id)
    text = spec.spec_text(job, str(JobFolder.of(get_ctx(request).settings.jobs_dir, job_id).code))
    how = "attachment" if download else "inline"
    return Response(text, media_type="text/plain; charset=utf-8",
                    headers={"Content-Disposition": f'{how}; filename="job-{job_id}.yaml"'})


@router.get("/jobs/{job_id}/status")
def job_status(request: Request, job_id: Id, session: SessionDep, viewer: ViewerDep) -> Response:
    return fragment("job_status.html", viewer=viewer, **_job_values(session, viewer, job_id))


@router.post("/jobs/{job_id}/{verb}")
def job_action(request: Request, job_id: Id, verb: str, session: SessionDep, viewer: ViewerDep) -> Response:
    actions = {"stop": service.stop, "resume": service.resume, "cancel": service.cancel}
    if verb not in actions:
        raise InvalidRequest(f"a job can be stopped, resumed or cancelled, not {verb!r}")
    viewer.may("POST", f"/v1/jobs/{{job_id}}/{verb}", job_id=job_id)
    actions[verb](session, viewer.principal, job_id)
    session.flush()
    return fragment("job_status.html", viewer=viewer, **_job_values(session, viewer, job_id))


@router.get("/jobs/{job_id}/metrics.json")
def job_metrics(job_id: Id, session: SessionDep, viewer: ViewerDep, max_points: int = 1000) -> Response:
    max_points = min(max(max_points, 2), 5000)  # the server downsamples: a chart never gets more
    job = service.get_job(session, viewer.principal, job_id)
    data = metrics.job_series(session, job, None, max_points)
    data["final"] = job.state in FINAL_STATES
    return JSONResponse(data)


@router.get("/jobs/{job_id}/usage.json")
def job_usage(job_id: Id, session: SessionDep, viewer: ViewerDep) -> Response:
    """CPU (cores), memory (MiB) and each GPU's utilization over time: the job page's Resources."""
    job = service.get_job(session, viewer.principal, job_id)
    data = monitoring.usage_of(session, job, max_points=720)  # an hour at the 5 s period
    data["final"] = job.state in FINAL_STATES
    return JSONResponse(data)


@router.get("/jobs/{job_id}/histograms.json")
def job_histograms(job_id: Id, session: SessionDep, viewer: ViewerDep) -> Response:
    return JSONResponse(metrics.histograms(session, viewer.principal, job_id, None, 40))


@router.get("/jobs/{job_id}/log")
def job_log(request: Request, job_id: Id, session: SessionDep, viewer: ViewerDep, rank: int = 0) -> Response:
    job = service.get_job(session, viewer.principal, job_id)
    if job.purged_at is not None:
        return HTMLResponse("(this job's files, its logs with them, were removed)")
    if rank < 0:
        raise InvalidRequest("rank must be 0 or more")
    text = tail(JobFolder.of(get_ctx(request).settings.jobs_dir, job_id).root, rank)
    return fragment("log.html", text=text)


@router.get("/jobs/{job_id}/events")
def job_events(job_id: Id, session: SessionDep, viewer: ViewerDep) -> Response:
    return fragment("events.html", events=service.list_events(session, viewer.principal, job_id))

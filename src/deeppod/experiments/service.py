"""Hyperparameter search experiments: create (checked whole before any trial job exists),
list, show, stop, resume. The controller (tune/controller.py) runs them."""

from __future__ import annotations

import functools
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import event, func, or_, select
from sqlalchemy.orm import Session

from deeppod.auth import scope
from deeppod.auth.paths import TenantRoots
from deeppod.auth.service import Principal, check_name
from deeppod.contract import ENV_TRIAL, ENV_TRIAL_HOST, ENV_TRIAL_JUDGED, FINAL_STATES, JobState, judged_between
from deeppod.errors import Conflict, Forbidden, InvalidRequest, NotFound
from deeppod.experiments.space import check_command, parse_space, render
from deeppod.experiments.study import PROMOTING, Study, check_choice, judged_steps
from deeppod.job_spec import JobSpec
from deeppod.jobs import service as jobs
from deeppod.jobs.code import CodeStore
from deeppod.models import service as models
from deeppod.states import ACTIVE_EXPERIMENTS, LIVE_TRIALS, ExperimentState, TrialState
from deeppod.store.models import Experiment, Job, Tenant, Trial, User, utcnow

log = logging.getLogger(__name__)
MODES = ("min", "max")
HANDED_MAX = 64  # studies kept for a controller to take over (a server that is not the leader takes none)
# the job fields a trial takes from the experiment's template
TEMPLATE = ("command", "workdir", "code", "workers", "max_workers", "gpus_per_worker", "cpus_per_worker",
            "memory_mb_per_worker", "gpu_memory_mb", "env", "priority", "grace_seconds", "time_limit_seconds",
            "max_restarts", "stop_rules",
            "datasets", "models",
            "requirements", "python", "image")


@dataclass
class ExperimentRequest:
    name: str
    space: dict
    metric: str
    job: dict  # a JobCreate's fields; the command holds {param} placeholders
    mode: str = "max"
    trials: int = 20
    parallel: int = 4
    sampler: str = "tpe"
    pruner: str = "asha"
    prune_after: int = 1  # the first step a trial may be stopped at (Ray Tune's grace period)
    seed: int | None = None
    register: str | None = None  # model name: the best trial's model becomes a version of it
    register_at_chance: bool = False  # even when it is no better than guessing
    reuse: bool = False  # a trial's process runs the next (runtime.trials()), as Ray Tune's reuse_actors


@dataclass
class TrialLauncher:
    """Where experiments keep their studies and how trials become jobs: the server's settings."""

    experiments_dir: Path
    jobs_dir: Path
    models_dir: Path
    default_grace: float = 30.0
    roots: TenantRoots | None = None
    code: CodeStore | None = None
    default_network: str = "host"  # DEEPPOD_JOB_NETWORK
    image_dir: str | None = None  # DEEPPOD_IMAGE_DIR
    _handed: dict[int, Study] = field(default_factory=dict, repr=False)

    def folder(self, experiment_id: int) -> Path:
        return self.experiments_dir / str(experiment_id)

    def study(self, exp: Experiment, session: Session | None = None) -> Study:
        """``session``: to count the trials asked so far, so that a seeded sampler opened again
        (a restart, another server) does not ask for the same values again."""
        seed = exp.seed
        if seed is not None and session is not None:
            seed += session.scalar(select(func.count()).select_from(Trial).where(Trial.experiment_id == exp.id)) or 0
        return Study(self.folder(exp.id), mode=exp.mode, sampler=exp.sampler, pruner=exp.pruner,
                     space=parse_space(exp.space), seed=seed, prune_after=exp.prune_after)

    def hand_over(self, session: Session, exp: Experiment, study: Study) -> None:
        """Keep the study that asked an experiment's first trial for this process's controller,
        once the experiment is committed: its sampler goes on with the one random stream, so a
        seed's start-up trials are the ones Optuna's own study with that seed proposes, where a
        study opened again must start a stream of its own (``seed`` plus the trials asked)."""
        def keep(_session) -> None:
            self._handed[exp_id] = study
            while len(self._handed) > HANDED_MAX:
                self._handed.pop(next(iter(self._handed)))

        exp_id = exp.id
        event.listen(session, "after_commit", keep, once=True)

    def take(self, exp: Experiment, session: Session) -> Study:
        """The study handed over for ``exp`` in this process, else one opened again."""
        return self._handed.pop(exp.id, None) or self.study(exp, session)

    def submit_trial(self, session: Session, principal: Principal, exp: Experiment, number: int,
                     params: dict) -> Job:
        t = exp.job
        req = JobSpec(**{k: t[k] for k in TEMPLATE if k in t and t[k] is not None and k != "command"},
                              command=render(t["command"], params), name=f"{exp.name}-t{number}")
        job = jobs.submit(session, principal, req, default_grace=self.default_grace, roots=self.roots,
                          code=self.code, jobs_dir=self.jobs_dir, default_network=self.default_network,
                          image_dir=self.image_dir,
                          resolve_models=functools.partial(models.resolve_for_job, root=self.models_dir))
        job.kind, job.params, job.preemptible = "trial", dict(params), True
        judged = judged_steps(exp.pruner, exp.prune_after)
        job.env = {**job.env, ENV_TRIAL: str(number), **({ENV_TRIAL_HOST: "1"} if exp.reuse else {}),
                   **({ENV_TRIAL_JUDGED: judged} if judged else {})}
        return job


def check_request(req: ExperimentRequest) -> dict:
    """Everything about the search that can be refused before anything is written; the space."""
    check_name("experiment", req.name)
    if not isinstance(req.metric, str) or not req.metric or len(req.metric) > 128:
        raise InvalidRequest("--metric must name the value your script reports (e.g. val_acc), at most 128 characters")
    if req.mode not in MODES:
        raise InvalidRequest(f"--mode must be min or max (got {req.mode!r})")
    if not 1 <= req.trials <= 10_000:
        raise InvalidRequest(f"--trials must be between 1 and 10000 (got {req.trials})")
    if not 1 <= req.parallel <= 1024:
        raise InvalidRequest(f"--parallel must be between 1 and 1024 (got {req.parallel})")
    if req.register is not None:
        check_name("model", req.register)
        if req.reuse:
            raise InvalidRequest("--register takes the best trial's model from its job's folder, and a reused "
                                 "process's trials share one: leave out --reuse, or register the model yourself "
                                 "('deeppod model register')")
    space = parse_space(req.space)
    command = req.job.get("command")
    if not command:
        raise InvalidRequest("the search has no command: put it after '--', e.g. "
                             "deeppod tune create NAME ... -- python train.py --lr {lr}")
    check_command(command, space, req.reuse)
    if req.pruner in PROMOTING and not req.reuse:
        raise InvalidRequest(f"--pruner {req.pruner} pauses a trial at a rung with its state kept in its process, "
                             "and promotes it later in that process: add --reuse (and keep the trial's state with "
                             "trial.keep(...), see docs/tune.md), or use --pruner asha")
    check_choice(req.sampler, req.pruner, space, req.prune_after)
    return space


def create(session: Session, principal: Principal, req: ExperimentRequest, launcher: TrialLauncher) -> Experiment:
    """The experiment and its first trial's job, in one transaction: a template the job service
    refuses (no such executable, too many GPUs, an unknown dataset) refuses the whole search."""
    space = check_request(req)
    if session.scalar(scope.own(select(Experiment.id).where(Experiment.name == req.name), Experiment,
                                principal)) is not None:
        raise Conflict(f"experiment {req.name!r} exists: pick another name, or see it with 'deeppod tune show "
                       f"{req.name}'")
    template = {k: v for k, v in req.job.items() if k in TEMPLATE}
    exp = Experiment(tenant_id=principal.tenant_id, user_id=principal.user_id, name=req.name,
                     state=ExperimentState.RUNNING,
                     metric=req.metric, mode=req.mode, trials=req.trials, parallel=req.parallel,
                     sampler=req.sampler, pruner=req.pruner, prune_after=req.prune_after, seed=req.seed,
                     space={n: p.to_dict() for n, p in space.items()}, job=template, register=req.register,
                     register_at_chance=req.register_at_chance, reuse=req.reuse)
    session.add(exp)
    session.flush()
    folder = launcher.folder(exp.id)
    shutil.rmtree(folder, ignore_errors=True)  # left by a database that was reset
    study = launcher.study(exp, session)
    try:
        add_trial(session, principal, exp, study, launcher)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    launcher.hand_over(session, exp, study)
    log.info("experiment %s/%s created: %d trials, %d at once", principal.tenant, exp.name, exp.trials, exp.parallel)
    return exp


def add_trial(session: Session, principal: Principal, exp: Experiment, study: Study, launcher: TrialLauncher) -> Trial:
    number, trial_id, params = study.ask()
    try:
        job = launcher.submit_trial(session, principal, exp, number, params)
    except BaseException:
        study.tell(number, "fail")
        raise
    return _record(session, exp, job, (number, trial_id, params), "")


def _record(session: Session, exp: Experiment, job: Job, asked: tuple[int, int, dict], where: str) -> Trial:
    """The study's new trial (``asked``: number, storage id, values), run by ``job``."""
    number, trial_id, params = asked
    trial = Trial(experiment_id=exp.id, number=number, study_trial_id=trial_id, job_id=job.id, params=params)
    session.add(trial)
    session.flush()
    jobs.add_event(session, job, "trial", f"trial {number} of experiment {exp.name}{where}: "
                                          + ", ".join(f"{k}={v}" for k, v in params.items()))
    return trial


def get_experiment(session: Session, principal: Principal, name: str, tenant: str | None = None) -> Experiment:
    """The caller's tenant's experiment ``name`` (an admin may name another tenant)."""
    q = select(Experiment).where(Experiment.name == name)
    if tenant is not None and tenant != principal.tenant:
        if not principal.is_admin:
            raise Forbidden("only an admin can see another tenant's experiments")
        q = scope.visible(q, Experiment, principal).where(
            Experiment.tenant_id == select(Tenant.id).where(Tenant.name == tenant).scalar_subquery())
    else:
        q = scope.own(q, Experiment, principal)
    exp = session.scalar(q)
    if exp is None:
        raise NotFound(f"no experiment named {name!r}: list them with 'deeppod tune ls'")
    return exp


def _manage(session: Session, principal: Principal, name: str, verb: str) -> Experiment:
    exp = get_experiment(session, principal, name)
    if not principal.may_manage(exp.user_id):
        raise Forbidden(f"experiment {name} is another user's; only they or a tenant admin can {verb} it")
    return exp


def list_experiments(session: Session, principal: Principal) -> list[tuple[Experiment, str, str, dict]]:
    """(experiment, tenant, user, trial counts by state), newest first."""
    q = scope.visible(select(Experiment, Tenant.name, User.name).join(Tenant, Experiment.tenant_id == Tenant.id)
                      .join(User, Experiment.user_id == User.id).order_by(Experiment.id.desc()), Experiment, principal)
    rows = list(session.execute(q))
    counts: dict[int, dict] = {}
    ids = [r[0].id for r in rows]
    if ids:
        for eid, state, n in session.execute(select(Trial.experiment_id, Trial.state, func.count())
                                             .where(Trial.experiment_id.in_(ids))
                                             .group_by(Trial.experiment_id, Trial.state)):
            counts.setdefault(eid, {})[state] = n
    return [(e, t, u, counts.get(e.id, {})) for e, t, u in rows]


def trials(session: Session, exp: Experiment) -> list[tuple[Trial, Job | None]]:
    rows = session.execute(select(Trial, Job).outerjoin(Job, Trial.job_id == Job.id)
                           .where(Trial.experiment_id == exp.id).order_by(Trial.number))
    return [(t, j) for t, j in rows]


def live_trials(session: Session, exp: Experiment) -> list[tuple[Trial, Job | None]]:
    """The trials still running or being pruned, with their jobs: all a controller round
    follows. A search thousands of trials long reads its few live ones, not every row."""
    rows = session.execute(select(Trial, Job).outerjoin(Job, Trial.job_id == Job.id)
                           .where(Trial.experiment_id == exp.id, Trial.state.in_(LIVE_TRIALS))
                           .order_by(Trial.number))
    return [(t, j) for t, j in rows]


def waiting_to_start(live: list[tuple[Trial, Job | None]]) -> bool:
    """A trial awaits its first start: ask for no more until it runs (--parallel is a bound)."""
    return any(j is not None and j.state == JobState.QUEUED and j.started_at is None for _, j in live)


def trial_numbers(session: Session, exp: Experiment, states: tuple) -> list[int]:
    return list(session.scalars(select(Trial.number).where(Trial.experiment_id == exp.id, Trial.state.in_(states))))


def trials_asked(session: Session, exp: Experiment) -> int:
    return session.scalar(select(func.count()).select_from(Trial).where(Trial.experiment_id == exp.id)) or 0


def host_trial(session: Session, principal: Principal, job_id: int, done: int | None = None,
               kept: list[int] | None = None, turn: int | None = None) -> dict:
    """What a search's process runs next (``runtime.trials()``): it says which trial it ended
    (``done``), and gets the trial the controller gave it ({"number", "params", "state",
    "turn"}), {"wait": true} while none is given yet, or {"finished": true} when it should
    exit: the search is over, stopping, or does not reuse processes (one trial a job). Of the
    paused trials it says it keeps (``kept``), ``forget`` names those that will not go on.
    ``turn``: which turn of ``done`` ended; the process says it again at every ask while it
    waits, and a trial promoted meanwhile (a later turn) is not ended by it."""
    job = jobs.manage_job(session, principal, job_id, "run trials in")
    forget = _forget(session, job.id, kept) if kept else {}
    if job.kind != "trial":
        raise InvalidRequest(f"job {job_id} is not a search's trial: outside a search runtime.trials() gives one "
                             "trial, from the job's environment")
    if done is not None:
        ended = session.scalar(select(Trial).where(Trial.job_id == job.id, Trial.number == done))
        if ended is None:
            raise InvalidRequest(f"trial {done} did not run in job {job_id}")
        if ended.done_at is None and ended.state in LIVE_TRIALS and (turn is None or turn == ended.turn):
            ended.done_at = utcnow()
    current = session.scalar(select(Trial).where(Trial.job_id == job.id, Trial.state.in_(LIVE_TRIALS),
                                                 Trial.done_at.is_(None)).order_by(Trial.number).limit(1))
    if current is not None:
        if current.claimed_at is None:  # from now on a pruner tells this process, not its job, to stop
            current.claimed_at = utcnow()
        return {"number": current.number, "params": dict(current.params), "state": current.state,
                "turn": current.turn, **forget}
    exp = session.scalar(select(Experiment).join(Trial, Trial.experiment_id == Experiment.id)
                         .where(Trial.job_id == job.id).limit(1))
    if (exp is None or not exp.reuse or exp.state != ExperimentState.RUNNING or job.stop_reason
            or job.state in FINAL_STATES):
        return {"finished": True, **forget}
    holds = session.scalar(select(Trial.id).where(Trial.job_id == job.id,
                                                  Trial.state.in_((TrialState.PAUSING, TrialState.PAUSED))).limit(1))
    if trials_asked(session, exp) >= exp.trials and holds is None:  # a process that keeps a paused trial waits
        return {"finished": True, **forget}
    return {"wait": True, **forget}


def _forget(session: Session, job_id: int, kept: list[int]) -> dict:
    going = set(session.scalars(select(Trial.number).where(
        Trial.job_id == job_id, Trial.number.in_(kept),
        Trial.state.in_((TrialState.PAUSING, TrialState.PAUSED, TrialState.RUNNING)))))
    gone = sorted(set(kept) - going)
    return {"forget": gone} if gone else {}


def trial_state(session: Session, principal: Principal, job_id: int, number: int) -> str:
    """The state of trial ``number`` of this job (a reused process asks if it was pruned)."""
    job = jobs.manage_job(session, principal, job_id, "run trials in")
    state = session.scalar(select(Trial.state).where(Trial.job_id == job.id, Trial.number == number))
    if state is None:
        raise NotFound(f"trial {number} did not run in job {job_id}")
    return state


def stopping(session: Session, job_id: int) -> dict[str, list[int]]:
    """What this job's process is to stop, in one query: ``pruning``, the trials a pruner
    stopped that it runs and has not yet said it ended (those its process took,
    runtime.trials() with --reuse, or the job's own trial in a search that gives each trial a
    job: the job is being stopped for it, and its process stops at once, not when the SIGTERM
    comes); ``pausing``, those promotion pauses at a rung (its process keeps their state).
    Empty for any other job. The caller may see the job."""
    out: dict[str, list[int]] = {"pruning": [], "pausing": []}
    for number, state in session.execute(
            select(Trial.number, Trial.state).join(Experiment, Experiment.id == Trial.experiment_id)
            .where(Trial.job_id == job_id, Trial.state.in_((TrialState.PRUNING, TrialState.PAUSING)),
                   Trial.done_at.is_(None), or_(Trial.claimed_at.is_not(None), Experiment.reuse.is_(False)))):
        out[state].append(number)
    return out


def pruning(session: Session, job_id: int) -> list[int]:
    return stopping(session, job_id)["pruning"]


def paused_trials(session: Session, exp: Experiment) -> list[tuple[Trial, Job | None]]:
    rows = session.execute(select(Trial, Job).outerjoin(Job, Trial.job_id == Job.id)
                           .where(Trial.experiment_id == exp.id, Trial.state == TrialState.PAUSED)
                           .order_by(Trial.number))
    return [(t, j) for t, j in rows]


def awaits_judgement(session: Session, job_id: int, points: list[dict]) -> bool:
    """Whether these reports of a search's trial reach a step its pruner decides on (a rung
    past the last step it judged): the answer to them then waits for the decision."""
    tops: dict[int, int] = {}
    for p in points:
        if isinstance(p.get("trial"), int) and isinstance(p.get("step"), int):
            tops[p["trial"]] = max(p["step"], tops.get(p["trial"], p["step"]))
    if not tops:
        return False
    rows = session.execute(select(Trial.number, Trial.step, Experiment.pruner, Experiment.prune_after)
                           .join(Experiment, Experiment.id == Trial.experiment_id)
                           .where(Trial.job_id == job_id, Trial.number.in_(tops), Trial.state == TrialState.RUNNING))
    return any(judged_between(judged_steps(pruner, after), step, tops[number]) for number, step, pruner, after in rows)


def idle_hosts(session: Session, exp: Experiment) -> list[Job]:
    """A reusing search's running jobs whose process has no trial to run: each takes the next."""
    busy = select(Trial.job_id).where(Trial.experiment_id == exp.id, Trial.state.in_(LIVE_TRIALS),
                                      Trial.done_at.is_(None))
    return list(session.scalars(
        select(Job).where(Job.id.in_(select(Trial.job_id).where(Trial.experiment_id == exp.id)),
                          Job.state == JobState.RUNNING, Job.stop_reason.is_(None), Job.id.not_in(busy))
        .order_by(Job.id)))


def hosts(session: Session, exp: Experiment) -> int:
    """How many of the search's jobs are not over (each a process that runs its trials)."""
    return session.scalar(select(func.count(func.distinct(Trial.job_id))).join(Job, Trial.job_id == Job.id)
                          .where(Trial.experiment_id == exp.id, Job.state.not_in(FINAL_STATES))) or 0


def assign_trial(session: Session, exp: Experiment, study: Study, host: Job) -> Trial:
    """The next trial, to a running process of the search that asks for one."""
    return _record(session, exp, host, study.ask(), ", in this job's process")


def best(session: Session, exp: Experiment) -> Trial | None:
    """The completed trial with the best final value."""
    order = Trial.value.desc() if exp.mode == "max" else Trial.value.asc()
    return session.scalar(select(Trial).where(Trial.experiment_id == exp.id, Trial.state == TrialState.COMPLETED,
                                              Trial.value.is_not(None)).order_by(order, Trial.number).limit(1))


def stop(session: Session, principal: Principal, name: str) -> Experiment:
    """No new trials; running ones stop gracefully (they keep their checkpoints): resume
    continues them."""
    exp = _manage(session, principal, name, "stop")
    if exp.state not in ACTIVE_EXPERIMENTS:
        raise Conflict(f"experiment {name} is {exp.state}; nothing to stop")
    exp.state, exp.reason = ExperimentState.STOPPING, f"stopped by {principal.user}"
    for trial, job in trials(session, exp):
        if trial.state in LIVE_TRIALS and job is not None and job.state not in FINAL_STATES and not job.stop_reason:
            jobs.stop(session, principal, job.id)
    return exp


def resume(session: Session, principal: Principal, name: str) -> Experiment:
    """A stopped experiment goes on: its stopped trials continue from their checkpoints and
    new trials start until the budget is spent."""
    exp = _manage(session, principal, name, "resume")
    if exp.state != ExperimentState.STOPPED:
        raise Conflict(f"experiment {name} is {exp.state}; only a stopped experiment can be resumed")
    exp.state, exp.reason, exp.ended_at = ExperimentState.RUNNING, f"resumed by {principal.user}", None
    for trial, job in trials(session, exp):
        if trial.state != TrialState.STOPPED or job is None or job.state != JobState.STOPPED:
            continue
        if job.purged_at is None:  # else its checkpoint went with its folder: the tune loop fails the trial
            jobs.resume(session, principal, job.id)
        trial.state, trial.ended_at = TrialState.RUNNING, None
    return exp


def finish(exp: Experiment, state: ExperimentState, reason: str) -> None:
    exp.state, exp.reason, exp.ended_at = state, reason, utcnow()


def search_of(session: Session, job_id: int) -> tuple[Experiment, str, list[int]] | None:
    """The search a trial's job belongs to, its tenant's name and the trial numbers it ran (the
    caller has read the job: its search is its tenant's)."""
    rows = session.execute(select(Trial.number, Experiment).join(Experiment, Trial.experiment_id == Experiment.id)
                           .where(Trial.job_id == job_id).order_by(Trial.number)).all()
    if not rows:
        return None
    exp = rows[0][1]
    return exp, session.get(Tenant, exp.tenant_id).name, [n for n, _ in rows]


def owner_names(session: Session, exp: Experiment) -> tuple[str, str]:
    return session.get(Tenant, exp.tenant_id).name, session.get(User, exp.user_id).name

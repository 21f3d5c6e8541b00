"""Runs experiments on the leader, one round at a time: pass each trial's new reports to its
study's pruner, ask the scheduler (through the job's should-stop path) to stop the trials it
prunes, tell the study how trials ended, start new trials while the search has budget and
room, and finish (and register the best model) when it is done.

Everything it needs is in the database and the study's journal, so a new leader (or a
restarted server) goes on where the last one stopped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from deeppod.auth.service import principal_of
from deeppod.contract import FINAL_STATES, JUDGE_WAIT_S, JobState
from deeppod.errors import DeepPodError, NotLeader
from deeppod.experiments import paused, service
from deeppod.experiments.study import Study, rungs
from deeppod.job_folder import JobFolder
from deeppod.jobs import time_limit
from deeppod.jobs.service import add_event
from deeppod.jobs.stopping import request_stop
from deeppod.loops import IDLE, run_ticks
from deeppod.models import artifacts
from deeppod.models import service as models
from deeppod.states import ACTIVE_EXPERIMENTS, LIVE_TRIALS, ExperimentState, TrialState
from deeppod.store.models import Experiment, Job, JobMetric, Tenant, Trial, User, utcnow
from deeppod.units import duration_text

log = logging.getLogger(__name__)


class ExperimentController:
    def __init__(self, sessions: sessionmaker[Session], launcher: service.TrialLauncher,
                 fence: Callable[[Session], None] = lambda s: None, leading: Callable[[], bool] = lambda: True):
        self.sessions = sessions
        self.leading = leading
        self.launcher = launcher
        self.fence = fence
        self._studies: dict[int, Study] = {}
        self.wake = threading.Event()  # set when an experiment is created in this process
        self.hurry = threading.Event()  # set when a trial's job starts or ends here: the next round now
        self._rounds = threading.Condition()  # rounds begun and ended: judged() waits on them
        self._rounds_begun = self._rounds_done = 0

    def study(self, s: Session, exp: Experiment) -> Study:
        if exp.id not in self._studies:
            self._studies[exp.id] = self.launcher.take(exp, s)
        return self._studies[exp.id]

    def judged(self, timeout: float = JUDGE_WAIT_S) -> bool:
        """Hurry the next round and wait until a round begun after this call has ended: what
        was committed before the call (a trial's reports at a rung) has been judged by then.
        False if none ended in ``timeout`` or this server is not the leader (it runs no round)."""
        if not self.leading():
            return False
        with self._rounds:
            target = self._rounds_begun + 1
        self.hurry.set()
        with self._rounds:
            return self._rounds.wait_for(lambda: self._rounds_done >= target, timeout)

    def tick(self) -> str | None:
        with self._rounds:
            self._rounds_begun += 1
        try:
            return self._tick()
        finally:
            with self._rounds:
                self._rounds_done += 1
                self._rounds.notify_all()

    def _tick(self) -> str | None:
        with self.sessions() as s:
            ids = list(s.scalars(select(Experiment.id).where(Experiment.state.in_(ACTIVE_EXPERIMENTS))))
        if not ids and not self._studies:
            return IDLE
        for exp_id in ids:
            try:
                with self.sessions.begin() as s:
                    self.fence(s)
                    self.step(s, s.get(Experiment, exp_id))
            except NotLeader:
                raise
            except Exception:  # one broken experiment must not stop the others
                log.exception("experiment %s: tick failed", exp_id)
        for gone in set(self._studies) - set(ids):
            del self._studies[gone]

    def step(self, s: Session, exp: Experiment) -> None:
        study = self.study(s, exp)
        rows = service.live_trials(s, exp)
        for trial, job in rows:
            self._follow(s, exp, study, trial, job)
        live = [(t, j) for t, j in rows if t.state in LIVE_TRIALS]  # those that did not end just now
        asked = service.trials_asked(s, exp)
        if exp.state == ExperimentState.STOPPING:
            if not live:
                paused.drop(s, exp, study, "its state kept by a process the stop ended")
                service.finish(exp, ExperimentState.STOPPED, exp.reason or "stopped")
            return
        if exp.reuse:
            given = paused.promote(s, exp, study, idle := service.idle_hosts(s, exp))
            for host in [h for h in idle if h.id not in given] if asked < exp.trials else ():
                live.append((service.assign_trial(s, exp, study, host), host))
                asked += 1
                if asked >= exp.trials:
                    break
            if given or (not live and asked >= exp.trials and paused.settle(s, exp, study)):
                return
            busy = service.hosts(s, exp)  # a process that runs trial after trial is busy until it exits
        else:
            # a trial being pruned gives its GPUs back in a moment: its successor is asked for now
            # and waits for them, rather than after the trial's exit is seen
            busy = sum(t.state != TrialState.PRUNING for t, _ in live)
        if asked < exp.trials and busy < exp.parallel and not service.waiting_to_start(live):
            owner = principal_of(s.get(User, exp.user_id), s.get(Tenant, exp.tenant_id))
            try:
                with s.begin_nested():
                    service.add_trial(s, owner, exp, study, self.launcher)
            except DeepPodError as exc:  # the template no longer works (a dataset removed, a quota...)
                service.finish(exp, ExperimentState.FAILED, f"could not start trial {asked}: {exc}")
                log.warning("experiment %s failed: %s", exp.name, exc)
            return
        if not live and asked >= exp.trials:
            self._complete(s, exp)

    def _follow(self, s: Session, exp: Experiment, study: Study, trial: Trial, job: Job | None) -> None:
        if job is None:  # removed behind our back: nothing will ever report
            trial.state, trial.reason, trial.ended_at = TrialState.FAILED, "its job was removed", utcnow()
            study.tell(trial.number, "fail")
            return
        rows = s.execute(select(JobMetric.step, JobMetric.value)
                         .where(JobMetric.job_id == job.id, JobMetric.name == exp.metric, JobMetric.step > trial.step,
                                JobMetric.value.is_not(None), *_of_trial(exp, trial))
                         .order_by(JobMetric.step, JobMetric.id))
        ordered = list({step: value for step, value in rows}.items())  # one per step, in order: its latest report
        if ordered:
            pruned_at = None
            after, prune = trial.step, False
            if trial.state != TrialState.PRUNING:  # what a pruned trial reports on its way out is not the study's
                prune = (trial.state == TrialState.RUNNING and exp.pruner != "none" and job.state == JobState.RUNNING
                         and not job.stopping)
                pruned_at = study.report(trial.study_trial_id, ordered, prune)
            trial.step = ordered[-1][0]
            if prune and paused.promoting(exp):
                paused.judge(s, exp, study, trial, job, after)
            values = [v for _, v in ordered] + ([trial.best] if trial.best is not None else [])
            trial.best = max(values) if exp.mode == "max" else min(values)
            if pruned_at is not None:
                self._prune(s, exp, trial, job, pruned_at)
        if trial.state == TrialState.PAUSING and trial.done_at is not None and job.state == JobState.RUNNING:
            paused.hold(s, job, trial)
        elif trial.done_at is not None or job.state in FINAL_STATES:
            self._ended(s, exp, study, trial, job)

    def _prune(self, s: Session, exp: Experiment, trial: Trial, job: Job, last: tuple[int, float]) -> None:
        why = f"pruned by {exp.pruner} at step {last[0]} ({exp.metric} {last[1]:g})"
        steps = rungs(exp.pruner, exp.prune_after)
        passed = [r for r in steps if r < last[0]]
        if passed and last[0] not in steps:  # judged again between rungs (Study._fell_behind)
            why += f": no longer among the best third at step {passed[-1]}, which it reached among the first"
        trial.state, trial.reason = TrialState.PRUNING, why
        log.info("experiment %s: trial %d %s", exp.name, trial.number, why)
        if trial.claimed_at is not None:  # its process runs trials one after another: it stops this one only
            add_event(s, job, "pruning", f"trial {trial.number} {why}; the job's process goes on to the next trial")
            return
        request_stop(s, job, why, stop_as=JobState.PRUNED, event="pruning")

    def _ended(self, s: Session, exp: Experiment, study: Study, trial: Trial, job: Job) -> None:
        trial.ended_at = utcnow()
        ended_as = job.state
        # a process that runs trial after trial ended this one (or exited after it): as a job's end would say
        if trial.done_at is not None or (trial.claimed_at is not None and job.state == JobState.SUCCEEDED):
            ended_as = JobState.PRUNED if trial.state in (TrialState.PRUNING,
                                                          TrialState.PAUSING) else JobState.SUCCEEDED
        if ended_as == JobState.PRUNED:
            trial.state = TrialState.PRUNED
            study.tell(trial.number, "pruned")
        elif ended_as == JobState.SUCCEEDED:
            self._scored(s, exp, study, trial, job, "it succeeded")
        elif time_limit.ended_by(job):  # a trial's time is its budget: what it reached by then counts (Ray Tune's)
            self._scored(s, exp, study, trial, job, f"it reached its time limit of "
                                                    f"{duration_text(job.time_limit_seconds)}")
        elif job.state == JobState.STOPPED and exp.state == ExperimentState.STOPPING:
            trial.state, trial.reason = TrialState.STOPPED, "the experiment was stopped; resume continues it"
        else:
            trial.state, trial.reason = TrialState.FAILED, f"its job {job.state}: {job.reason}"
            study.tell(trial.number, "fail")

    @staticmethod
    def _scored(s: Session, exp: Experiment, study: Study, trial: Trial, job: Job, how: str) -> None:
        """The trial ended whole: its value is the last it reported."""
        last = s.execute(select(JobMetric.value).where(JobMetric.job_id == job.id, JobMetric.name == exp.metric,
                                                       *_of_trial(exp, trial))
                         .order_by(JobMetric.step.desc(), JobMetric.id.desc()).limit(1)).scalar()
        if last is None:
            trial.state = TrialState.FAILED
            trial.reason = f"{how} but never reported {exp.metric} (runtime.report(step, {exp.metric}=...))"
            study.tell(trial.number, "fail")
        else:
            trial.state, trial.value = TrialState.COMPLETED, last
            trial.reason = "" if how == "it succeeded" else f"{how}: its last {exp.metric} counts"
            study.tell(trial.number, "complete", last)

    def _complete(self, s: Session, exp: Experiment) -> None:
        top = service.best(s, exp)
        if top is None:
            service.finish(exp, ExperimentState.FAILED, f"no trial completed with a {exp.metric} value")
            return
        exp.best_trial = top.number
        reason = f"best: trial {top.number}, {exp.metric} {top.value:g}"
        chance = self._chance(exp, top)
        if exp.register and not exp.registered and chance is not None and not exp.register_at_chance:
            reason += (f"; not registered as {exp.register}: {exp.metric} {top.value:g} is no better than chance "
                       f"({chance:g}, 1 of {round(1 / chance)} classes): widen the search or train longer "
                       f"(--register-at-chance registers it anyway)")
        elif exp.register and not exp.registered:
            try:
                with s.begin_nested():
                    exp.registered = self._register(s, exp, top)
                reason += f"; registered as {exp.registered}"
            except (DeepPodError, OSError) as exc:
                reason += f"; could not register its model: {exc}"
                log.warning("experiment %s: could not register the best model: %s", exp.name, exc)
        service.finish(exp, ExperimentState.COMPLETED, reason)
        log.info("experiment %s completed: %s", exp.name, reason)

    def _chance(self, exp: Experiment, top: Trial) -> float | None:
        """1 / classes when the best trial's accuracy is no better than that (a model that guesses),
        else None. Known for a classifier whose artifact names its classes and an accuracy metric."""
        if "acc" not in exp.metric.lower() or exp.mode != "max" or top.value is None:
            return None
        try:
            classes = artifacts.read_signature(JobFolder.of(self.launcher.jobs_dir, top.job_id).model).get("classes")
        except (DeepPodError, OSError, ValueError, AttributeError):
            return None
        if not isinstance(classes, list) or len(classes) < 2:
            return None
        chance = 1.0 / len(classes)
        return chance if top.value <= chance + 1e-9 else None

    def _register(self, s: Session, exp: Experiment, top: Trial) -> str:
        owner = principal_of(s.get(User, exp.user_id), s.get(Tenant, exp.tenant_id))
        model, version = models.register(s, owner, exp.register, root=self.launcher.models_dir,
                                         jobs_dir=self.launcher.jobs_dir, job_id=top.job_id)
        version.lineage = {**version.lineage, "experiment": exp.name, "experiment_id": exp.id, "trial": top.number,
                           "hyperparameters": dict(top.params), "metric": exp.metric, "value": top.value}
        return f"{model.name}@{version.version}"

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        run_ticks(self.tick, stop, interval, "experiments", wake=self.wake, hurry=self.hurry)


def _of_trial(exp: Experiment, trial: Trial) -> tuple:
    """Where a search reuses processes, its jobs' metrics say which trial they are of."""
    return (JobMetric.trial == trial.number,) if exp.reuse else ()

"""The controller's side of promotion (``--pruner asha-promote``): pause a trial at its rung,
hand a promoted one back to the process that keeps it, prune those never promoted. The
decisions are experiments.promotion's; this applies them to the rows."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from deeppod.contract import JobState
from deeppod.experiments import promotion, service
from deeppod.experiments.study import PROMOTING, Study, rungs
from deeppod.jobs.service import add_event
from deeppod.states import LIVE_TRIALS, TrialState
from deeppod.store.models import Experiment, Job, Trial, utcnow

log = logging.getLogger(__name__)


def promoting(exp: Experiment) -> bool:
    return exp.pruner in PROMOTING and exp.reuse


def _rungs(exp: Experiment) -> list[int]:
    return rungs(exp.pruner, exp.prune_after)


def judge(s: Session, exp: Experiment, study: Study, trial: Trial, job: Job, after: int) -> None:
    """``trial`` reported up to ``trial.step`` (it had reached ``after``): at a rung it passed
    just now, it goes on or pauses there (the highest such rung decides)."""
    passed = [r for r in _rungs(exp) if after < r <= trial.step]
    if not passed:
        return
    rung = passed[-1]
    decision = promotion.judge(study.values_at({rung})[rung], trial.number, rung, exp.mode)
    if decision.go:
        add_event(s, job, "trial", f"trial {trial.number} {decision.reason}")
        return
    trial.state, trial.reason = TrialState.PAUSING, decision.reason
    log.info("experiment %s: trial %d %s", exp.name, trial.number, decision.reason)
    add_event(s, job, "pausing", f"trial {trial.number} {decision.reason}; its process keeps it and goes on to "
                                 "the next trial")


def hold(s: Session, job: Job, trial: Trial) -> None:
    """Its process said it stopped the pausing trial and keeps its state: it waits at its rung."""
    trial.state = TrialState.PAUSED
    add_event(s, job, "paused", f"trial {trial.number} waits at step {trial.step}, kept by this job's process")


def _resume(s: Session, exp: Experiment, trial: Trial, job: Job, why: str) -> None:
    trial.state, trial.done_at, trial.turn, trial.reason = TrialState.RUNNING, None, trial.turn + 1, ""
    log.info("experiment %s: trial %d %s", exp.name, trial.number, why)
    add_event(s, job, "trial", f"trial {trial.number} {why}: this job's process goes on with it from step "
                               f"{trial.step + 1}")


def _prune(s: Session, study: Study, trial: Trial, job: Job | None, why: str) -> None:
    trial.state, trial.reason, trial.ended_at = TrialState.PRUNED, why, utcnow()
    study.tell(trial.number, "pruned")
    if job is not None:
        add_event(s, job, "pruning", f"trial {trial.number} {why}")


def _waiting(s: Session, exp: Experiment, study: Study) -> list[tuple[Trial, Job]]:
    """The paused trials whose process still keeps them; those whose process ended are pruned."""
    out = []
    for trial, job in service.paused_trials(s, exp):
        if job is None or job.state != JobState.RUNNING or job.stop_reason:
            _prune(s, study, trial, job, f"paused at step {trial.step}, and its process ended with its state")
        else:
            out.append((trial, job))
    return out


def _can_reach(s: Session, exp: Experiment, at_step: dict[int, dict[int, float]]) -> dict[int, int]:
    """Per rung step: how many trials may still report there (not asked yet, or not ended and
    not there yet)."""
    left = exp.trials - service.trials_asked(s, exp)
    going = service.trial_numbers(s, exp, (*LIVE_TRIALS, TrialState.PAUSED))  # a few: not every trial asked
    return {step: left + sum(n not in values for n in going) for step, values in at_step.items()}


def promote(s: Session, exp: Experiment, study: Study, idle: list[Job]) -> set[int]:
    """Prune the paused trials that can no longer be promoted (their processes need not keep
    them), then hand each idle process the best of its paused trials that is now among the
    best third of its rung. Returns the ids of the jobs given one."""
    if not promoting(exp):
        return set()
    waiting = _waiting(s, exp, study)
    if not waiting:
        return set()
    paused = {t.number: t.step for t, _ in waiting}
    at_step = study.values_at(set(paused.values()))
    rows = {t.number: (t, j) for t, j in waiting}
    for number in promotion.hopeless(paused, at_step, exp.mode, _can_reach(s, exp, at_step)):
        trial, job = rows.pop(number)
        _prune(s, study, trial, job, f"paused at step {trial.step}, and no longer able to be among the best third "
                                     "of that rung, whatever the trials still to come score")
        del paused[number]
    if not rows or not idle:
        return set()
    free, given = {j.id for j in idle}, set()
    for number in promotion.promotable(paused, at_step, exp.mode):
        trial, job = rows[number]
        if job.id in free and job.id not in given and job.state == JobState.RUNNING:
            _resume(s, exp, trial, job, f"promoted at step {trial.step}: now among the best third of the "
                                        f"{len(at_step[trial.step])} trials that reached it")
            given.add(job.id)
    return given


def settle(s: Session, exp: Experiment, study: Study) -> bool:
    """Nothing runs and no trial is left to ask: if no trial completed, the best paused one
    of the highest rung goes on (True); else every paused trial is pruned (False)."""
    if not promoting(exp):
        return False
    waiting = _waiting(s, exp, study)
    if not waiting:
        return False
    if service.best(s, exp) is None:
        paused = {t.number: t.step for t, _ in waiting}
        number = promotion.last_call(paused, study.values_at(set(paused.values())), exp.mode)
        trial, job = next((t, j) for t, j in waiting if t.number == number)
        _resume(s, exp, trial, job, f"goes on from step {trial.step}: the best of the highest rung, where no "
                                    "trial has completed and none is left to start")
        return True
    drop(s, exp, study, "never among the best third of its rung; the search has no trials left")
    return False


def drop(s: Session, exp: Experiment, study: Study, why: str) -> None:
    for trial, job in service.paused_trials(s, exp):
        _prune(s, study, trial, job, f"paused at step {trial.step}, {why}")

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict
from deeppod.api.schemas.jobs import JobCreate
from deeppod.experiments.study import MAX_PRUNE_AFTER


class ExperimentCreate(Strict):
    name: str = Field(max_length=64)
    space: dict = Field(description="{name: {type: float|int|categorical, low, high, log, step, choices, env_only}}")
    metric: str = Field(max_length=128, description="the value trials report with runtime.report(step, NAME=...)")
    mode: str = Field(default="max", description="max or min")
    trials: int = Field(default=20, ge=1, le=10_000, description="the budget: trials in all")
    parallel: int = Field(default=4, ge=1, le=1024, description="at most this many trials at once")
    sampler: str = Field(default="tpe", description="tpe, random, grid or cmaes")
    pruner: str = Field(default="asha",
                        description="asha, asha-promote (pauses trials at a rung and promotes them later; needs "
                        "reuse), hyperband, median or none")
    prune_after: int = Field(default=1, ge=1, le=MAX_PRUNE_AFTER,
                             description="the first reported step at which the pruner "
                                                                     "may stop a trial (asha's and hyperband's first "
                                                                     "rung, then 3x, 9x...; the median rule's warm-up)")
    seed: int | None = None
    register_as: str | None = Field(default=None, max_length=64, alias="register",
                                    description="register the best trial's model as a new version of this model")
    register_at_chance: bool = Field(default=False, description="register it even when its accuracy is no better "
                                                                "than chance (1 / classes)")
    reuse: bool = Field(default=False, description="a trial's process runs the next trial when its script loops "
                                                   "over runtime.trials() (torch imported and data loaded once); "
                                                   "a script that does not gets a process per trial")
    job: JobCreate = Field(description="every trial's job; {param} in the command is the trial's value")


class HostTrialIn(Strict):
    done: int | None = Field(default=None, ge=0, description="the trial this process just ended")
    turn: int | None = Field(default=None, ge=0, description="which of the done trial's turns it ended (it was "
                                                           "handed out again after a pause): an earlier turn's word, "
                                                           "repeated while the process waits, ends no later one")
    kept: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=100_000,
                                                    description="the paused trials whose state this process keeps")


class HostTrialOut(Out):
    number: int | None = None
    params: dict | None = None
    state: str | None = None
    turn: int | None = Field(default=None, description="how many times it was handed out before: a paused trial "
                                                       "promoted is handed to its process again")
    forget: list[int] | None = Field(default=None, description="of the kept trials, those that will not go on")
    wait: bool | None = Field(default=None, description="no trial for it yet: ask again in a moment")
    finished: bool | None = Field(default=None, description="no more trials for this process: it should exit")


class TrialOut(Out):
    number: int
    job_id: int
    params: dict
    state: str
    value: float | None
    best: float | None
    step: int
    job_state: str | None = None
    restarts: int = 0
    reason: str = ""


class ExperimentOut(Out):
    id: int
    name: str
    tenant: str
    user: str
    state: str
    metric: str
    mode: str
    trials: int
    parallel: int
    sampler: str
    pruner: str
    prune_after: int = 1
    space: dict
    command: list[str]
    register_as: str | None = Field(alias="register")
    registered: str | None
    reuse: bool = False
    best_trial: int | None
    best_value: float | None = None
    best_params: dict | None = None
    reason: str
    counts: dict = Field(default_factory=dict, description="trials by state")
    created_at: datetime
    ended_at: datetime | None
    trial_table: list[TrialOut] | None = Field(default=None, description="every trial (show only)")


def experiment_out(exp, tenant: str, user: str, counts: dict, best=None, rows=None) -> ExperimentOut:
    """``best``: its best completed trial so far (tune.service.best); ``rows``: (trial, job) for show."""
    trial_table = None
    if rows is not None:
        trial_table = [TrialOut(number=t.number, job_id=t.job_id, params=t.params, state=t.state, value=t.value,
                               best=t.best, step=t.step, job_state=str(j.state) if j is not None else None,
                               restarts=j.restart_count if j is not None else 0, reason=t.reason) for t, j in rows]
    return ExperimentOut(
        id=exp.id, name=exp.name, tenant=tenant, user=user, state=exp.state, metric=exp.metric, mode=exp.mode,
        trials=exp.trials, parallel=exp.parallel, sampler=exp.sampler, pruner=exp.pruner, prune_after=exp.prune_after,
        space=exp.space,
        command=list(exp.job.get("command", [])), register=exp.register, registered=exp.registered,
        reuse=bool(exp.reuse),
        best_trial=best.number if best else exp.best_trial, best_value=best.value if best else None,
        best_params=best.params if best else None, reason=exp.reason, counts=counts,
        created_at=exp.created_at, ended_at=exp.ended_at, trial_table=trial_table)

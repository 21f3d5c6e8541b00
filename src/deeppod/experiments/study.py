"""The experiment's Optuna study: samplers and pruners by name, its journal file in the
experiment's folder (the study survives a server restart with it), ask, report, tell."""

from __future__ import annotations

import logging
from pathlib import Path

from deeppod.contract import JUDGED_EVERY_STEP
from deeppod.errors import InvalidRequest
from deeppod.experiments.space import Param, grid_size

log = logging.getLogger(__name__)
SAMPLERS = ("tpe", "random", "grid", "cmaes")
PRUNERS = ("asha", "asha-promote", "hyperband", "median", "none")
PROMOTING = ("asha-promote",)  # decided by experiments.promotion, not by an Optuna pruner
RUNG_BASE = 3  # the pruners' reduction factor: successive halving's rungs are at steps 1, 3, 9, ...
MAX_RUNG_STEP = 10**7
MAX_PRUNE_AFTER = 10**6
JOURNAL = "optuna.journal"
LOCK_GRACE_S = 5  # a journal lock untouched this long is a dead writer's (an append takes milliseconds)


def _optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its per-trial INFO lines would flood the server log
    return optuna


def _rung_key(rung: int) -> str:
    """Where Optuna's successive halving keeps a trial's value at the rung it passed."""
    return f"completed_rung_{rung}"


def check_choice(sampler: str, pruner: str, space: dict[str, Param], prune_after: int = 1) -> None:
    if sampler not in SAMPLERS:
        raise InvalidRequest(f"unknown sampler {sampler!r}: use one of {', '.join(SAMPLERS)}")
    if pruner not in PRUNERS:
        raise InvalidRequest(f"unknown pruner {pruner!r}: use one of {', '.join(PRUNERS)}")
    if not isinstance(prune_after, int) or not 1 <= prune_after <= MAX_PRUNE_AFTER:
        raise InvalidRequest(f"--prune-after must be a step from 1 to {MAX_PRUNE_AFTER} (got {prune_after!r}): the "
                             "first reported step at which the pruner may stop a trial")
    if sampler == "grid":
        grid_size(space)
    if sampler == "cmaes" and all(p.type == "categorical" for p in space.values()):
        raise InvalidRequest("CMA-ES searches numeric parameters and this space has none: use tpe or random")


def distributions(space: dict[str, Param]) -> dict:
    optuna = _optuna()
    d = optuna.distributions
    out = {}
    for p in space.values():
        if p.type == "categorical":
            out[p.name] = d.CategoricalDistribution(list(p.choices))
        elif p.type == "int":
            out[p.name] = d.IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
        else:
            out[p.name] = d.FloatDistribution(p.low, p.high, log=p.log, step=p.step)
    return out


def make_sampler(name: str, space: dict[str, Param], seed: int | None):
    s = _optuna().samplers
    if name == "tpe":
        return s.TPESampler(seed=seed)
    if name == "random":
        return s.RandomSampler(seed=seed)
    if name == "grid":
        return s.GridSampler({p.name: p.grid() for p in space.values()}, seed=seed)
    # categorical parameters go to an independent sampler, as CMA-ES handles numbers only
    return s.CmaEsSampler(seed=seed, warn_independent_sampling=False)


def make_pruner(name: str, prune_after: int = 1):
    """``prune_after``: the first step a trial may be stopped at (Ray Tune's grace period,
    Optuna's min_resource): successive halving's first rung, the median rule's warm-up."""
    p = _optuna().pruners
    if name == "asha":  # asynchronous successive halving: rungs at steps r, 3r, 9r, 27r, ...
        # A fixed first rung (Ray Tune's grace period), not "auto": auto waits for a trial to
        # complete, and the trials running meanwhile are then judged at every passed rung with
        # their current value, which inflates those rungs against every later trial.
        return p.SuccessiveHalvingPruner(min_resource=prune_after, reduction_factor=RUNG_BASE)
    if name in PROMOTING:  # the controller pauses and promotes (experiments.promotion)
        return p.NopPruner()
    if name == "hyperband":
        return p.HyperbandPruner(min_resource=prune_after, reduction_factor=RUNG_BASE)
    if name == "median":
        return p.MedianPruner(n_startup_trials=4, n_warmup_steps=prune_after)
    return p.NopPruner()


def judged_steps(name: str, prune_after: int = 1) -> str:
    """The steps at which the pruner ``name`` decides, as ENV_TRIAL_JUDGED says them: the rungs
    of (asynchronous) successive halving and Hyperband (min_resource ``prune_after``, factor 3:
    every bracket's rungs are ``prune_after`` times powers of 3), every step for the median
    rule, none without a pruner."""
    if name in ("asha", "hyperband", *PROMOTING):
        steps, step = [], prune_after
        while step <= MAX_RUNG_STEP:
            steps.append(step)
            step *= RUNG_BASE
        return ",".join(map(str, steps))
    return JUDGED_EVERY_STEP if name == "median" else ""


def rungs(name: str, prune_after: int = 1) -> list[int]:
    """The pruner's rungs as numbers (none for the median rule, which judges every step)."""
    judged = judged_steps(name, prune_after)
    return [] if judged == JUDGED_EVERY_STEP else [int(s) for s in judged.split(",") if s]


class Study:
    """One experiment's study, opened from its journal file."""

    def __init__(self, folder: Path, *, mode: str, sampler: str, pruner: str, space: dict[str, Param],
                 seed: int | None, prune_after: int = 1):
        optuna = _optuna()
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

        folder.mkdir(parents=True, exist_ok=True)
        self.space = space
        self._pruner = pruner
        self._dists = distributions(space)
        path = str(folder / JOURNAL)
        # the journal's lock is held across each append's fsync: a server killed then leaves it
        # behind, and Optuna's default 30 s grace stalled the restarted server's whole tune loop
        storage = JournalStorage(JournalFileBackend(path, lock_obj=JournalFileSymlinkLock(path, LOCK_GRACE_S)))
        self.study = optuna.create_study(
            study_name="experiment", storage=storage, load_if_exists=True,
            direction="maximize" if mode == "max" else "minimize",
            sampler=make_sampler(sampler, space, seed), pruner=make_pruner(pruner, prune_after))

    def ask(self) -> tuple[int, int, dict]:
        """A new trial: (number, storage trial id, params)."""
        trial = self.study.ask(self._dists)
        return trial.number, trial._trial_id, dict(trial.params)

    def _trial(self, trial_id: int):
        import optuna

        return optuna.trial.Trial(self.study, trial_id)

    def report(self, trial_id: int, values: list[tuple[int, float]], prune: bool = True) -> tuple[int, float] | None:
        """Report ``values`` step by step and, with ``prune``, ask the pruner after each one, as
        a trial in one process would: successive halving compares trials at its rung's step, not
        at whatever step a batch of reports reached. Returns the (step, value) the pruner stops
        the trial at (the steps after it are not reported), or None."""
        trial = self._trial(trial_id)
        for step, value in values:
            trial.report(value, step)
            if prune and trial.should_prune():
                return step, value
        if prune and values and self._pruner == "asha" and self._fell_behind(trial_id):
            return values[-1]
        return None

    def _fell_behind(self, trial_id: int) -> bool:
        """Successive halving judged again: a trial went on from its last rung as one of the best
        third *so far* (the first to arrive there go on unjudged); it goes on to the next rung
        only while it stays among the best third of every trial that has reached that rung. On
        digits a trial at chance ran all 27 epochs for having reached each rung first
        (docs/benchmarks.md, session 32)."""
        trials = self.study.get_trials(deepcopy=False)
        attrs = next(t.system_attrs for t in trials if t._trial_id == trial_id)
        rung = 0
        while _rung_key(rung) in attrs:
            rung += 1
        if rung == 0:
            return False
        key = _rung_key(rung - 1)
        value = attrs[key]
        there = sorted(t.system_attrs[key] for t in trials if key in t.system_attrs)
        kept = max(1, len(there) // RUNG_BASE)  # Optuna's rule: the best len // 3, at least one
        if self.study.direction.name == "MAXIMIZE":
            return value < there[-kept]
        return value > there[kept - 1]

    def values_at(self, steps: set[int]) -> dict[int, dict[int, float]]:
        """Every trial's reported value at each of ``steps`` (a rung): step -> number -> value.
        Failed trials are left out."""
        import optuna

        out: dict[int, dict[int, float]] = {s: {} for s in steps}
        for t in self.study.get_trials(deepcopy=False):
            if t.state == optuna.trial.TrialState.FAIL:
                continue
            for step in steps & t.intermediate_values.keys():
                out[step][t.number] = t.intermediate_values[step]
        return out

    def tell(self, number: int, state: str, value: float | None = None) -> None:
        """``state``: complete (with its value), pruned or fail. Telling twice is harmless (a new
        leader may repeat the last round's tell)."""
        import optuna

        states = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED,
                  "fail": optuna.trial.TrialState.FAIL}
        self.study.tell(number, value if state == "complete" else None, state=states[state],
                        skip_if_finished=True)

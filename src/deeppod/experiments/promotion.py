"""Successive halving by promotion (the pruner ``asha-promote``): which paused trial goes on.

ASHA as its paper gives it (Li et al., "A System for Massively Parallel Hyperparameter
Tuning", MLSys 2020): a trial that reaches a rung goes on only if it is among the best
1/3 of the trials that reached that rung so far; otherwise it waits there (paused, its
state kept by its process) and is promoted later if enough worse trials arrive. The
stopping form (``asha``: Optuna's SuccessiveHalvingPruner, Ray Tune's ASHAScheduler) lets the
first trials to reach a rung through whatever they score, since nothing is there to compare
them with; on a short search those are a good share of all the epochs it runs.

Pure: values in, decisions out; the controller applies them.
"""

from __future__ import annotations

from dataclasses import dataclass

from deeppod.experiments.study import RUNG_BASE


@dataclass(frozen=True)
class AtRung:
    """What a trial that reached a rung does: go on (promoted) or wait there, and why."""

    go: bool
    reason: str


def _ranked(values: dict[int, float], mode: str) -> list[int]:
    # the better value first; of equal values the earlier trial (it got there first)
    return sorted(values, key=lambda n: (-values[n] if mode == "max" else values[n], n))


def quota(reached: int) -> int:
    """How many of the trials that reached a rung go on from it."""
    return reached // RUNG_BASE


def judge(values: dict[int, float], number: int, step: int, mode: str) -> AtRung:
    """Trial ``number`` just reported ``values[number]`` at the rung at ``step``; ``values``
    holds every trial's value there (those that went on, wait there or were pruned since)."""
    keep, ranked = quota(len(values)), _ranked(values, mode)
    where = f"{ranked.index(number) + 1} of {len(values)} at step {step}"
    if ranked.index(number) < keep:
        return AtRung(True, f"promoted at step {step}: {where}, the best {keep} go on")
    need = "" if keep else f"; the first goes on when {RUNG_BASE} have reached it"
    return AtRung(False, f"paused at step {step}: {where}, the best {keep} go on{need}")


def promotable(paused: dict[int, int], at_step: dict[int, dict[int, float]], mode: str) -> list[int]:
    """The paused trials (number -> the rung step it waits at) that are now among the best
    1/3 of their rung, those of the highest rung first, the best first within one."""
    out = []
    for step in sorted({s for s in paused.values()}, reverse=True):
        values = at_step.get(step, {})
        best = _ranked(values, mode)[:quota(len(values))]
        out += [n for n in best if paused.get(n) == step]
    return out


def hopeless(paused: dict[int, int], at_step: dict[int, dict[int, float]], mode: str,
             can_reach: dict[int, int]) -> list[int]:
    """The paused trials that can never be promoted: even if every trial that may still reach
    their rung (``can_reach``: rung step -> how many, asked or not) did so below them, they
    would not be among its best third. Their processes need not keep them. The best of a rung
    is never one: where nothing else goes on it may get the last call."""
    out = []
    for number, step in paused.items():
        values = at_step.get(step, {})
        rank = _ranked(values, mode).index(number) if number in values else 0
        if rank > 0 and rank >= quota(len(values) + can_reach.get(step, 0)):
            out.append(number)
    return sorted(out)


def last_call(paused: dict[int, int], at_step: dict[int, dict[int, float]], mode: str) -> int | None:
    """Where nothing runs and no trial is left to ask: the paused trial that goes on anyway,
    the best of the highest rung (a search whose rungs never filled would otherwise complete
    no trial at all)."""
    if not paused:
        return None
    top = max(paused.values())
    waiting = {n: at_step.get(top, {}).get(n) for n, s in paused.items() if s == top}
    known = {n: v for n, v in waiting.items() if v is not None}
    return _ranked(known, mode)[0] if known else min(waiting)

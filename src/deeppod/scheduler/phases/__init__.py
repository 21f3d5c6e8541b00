"""The scheduling round as a pipeline of named phases, each a module with one entry,
``run(state)``, reading and changing the round's state (round_state.RoundState). A phase that
can be turned off has ``enabled(state)`` too, read from its Config flag. The order and the set
that runs are ``Config.phases``, by name; the default is the order below:

1. health: jobs on unhealthy nodes or GPUs are preempted;
2. candidates: the jobs later phases may shrink or preempt, and which of them borrow;
3. reclaim: a tenant below its guarantee gets GPUs back from tenants above theirs;
4. fair_share: a tenant below its fair share shrinks elastic jobs of tenants above theirs;
5. priority: within a tenant, a higher-priority job preempts lower-priority ones;
6. least_attained: a job of a lower service class takes GPUs from jobs of higher classes;
7. starts: waiting jobs start, tenants neediest first, with reservations and backfill;
8. grow: idle GPUs grow elastic jobs toward their maximum.

Where the cluster has its own scheduler (Slurm), the round is one phase, hand_off: every job the
plan allows goes to that scheduler, which decides (``HANDED_OFF``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from deeppod.scheduler.phases import (
    candidates,
    fair_share,
    grow,
    hand_off,
    health,
    least_attained,
    priority,
    reclaim,
    starts,
)
from deeppod.scheduler.round_state import RoundState

PHASES: dict[str, ModuleType] = {"health": health, "candidates": candidates, "reclaim": reclaim,
                                 "fair_share": fair_share, "priority": priority, "least_attained": least_attained,
                                 "starts": starts, "grow": grow, "hand_off": hand_off}
HANDED_OFF = ("hand_off",)


def pipeline(names: tuple[str, ...]) -> list[tuple[str, Callable[[RoundState], None], Callable | None]]:
    """The phases ``names`` names, in that order: (name, run, enabled or None)."""
    unknown = [n for n in names if n not in PHASES]
    if unknown:
        raise ValueError(f"no scheduling phase {unknown[0]!r}: the phases are {', '.join(PHASES)}")
    return [(n, PHASES[n].run, getattr(PHASES[n], "enabled", None)) for n in names]

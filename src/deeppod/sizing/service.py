"""Sizing on the server (``POST /v1/sizing`` and the console's Admin page): the model
``deeppod size`` runs, for administrators and tenant admins, bounded so that one request
cannot hold the server: the simulator replays at most MAX_ARRIVALS runs of at most
MAX_TENANTS users on at most MAX_SIMULATED_GPUS (past any, the answer is the arithmetic alone,
and says so), for at most BUDGET_S seconds, and stops when the client has gone."""

from __future__ import annotations

import math
import time
from dataclasses import replace

from deeppod.auth import roles
from deeppod.errors import Forbidden
from deeppod.sizing.model import DAYS, Recommendation, Workload, size

MAX_ARRIVALS = 20_000
MAX_SIMULATED_GPUS = 4096
MAX_TENANTS = 1_000  # each simulated user is a tenant of the simulator's plan: its round grows with them
BUDGET_S = 20.0  # of simulations a request may run, by default (settings.sizing_budget_seconds)


def check_may(principal) -> None:
    if principal.role not in (roles.ADMIN, roles.TENANT_ADMIN):
        raise Forbidden("sizing a cluster is for administrators and tenant admins; 'deeppod size' gives the same "
                        "answer on your own machine")


def recommend(principal, workload: Workload, gone=None, clock=time.monotonic,
              budget_s: float = BUDGET_S) -> Recommendation:
    """``gone()``: whether the client hung up (its work is then given up at the next size);
    ``budget_s``: the server's DEEPPOD_SIZING_BUDGET_SECONDS."""
    check_may(principal)
    rough = size(replace(workload, simulate=False))  # arithmetic only: at once
    if not workload.simulate:
        return rough
    arrivals = DAYS * workload.users * workload.runs_per_user_day
    users = min(workload.users, math.ceil(arrivals))
    if arrivals > MAX_ARRIVALS or rough.training_gpus > MAX_SIMULATED_GPUS or users > MAX_TENANTS:
        rough.why.append(f"the wait was not simulated here ({arrivals:,.0f} runs of {users:,} users on "
                         f"{rough.training_gpus:,} GPUs; the server replays at most {MAX_ARRIVALS:,} runs of "
                         f"{MAX_TENANTS:,} users on {MAX_SIMULATED_GPUS:,}): 'deeppod size' simulates any size on "
                         "your own machine")
        return rough
    deadline = clock() + budget_s
    return size(workload, stop=lambda: clock() > deadline or (gone is not None and gone()))

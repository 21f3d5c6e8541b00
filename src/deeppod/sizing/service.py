"""Sizing on the server (``POST /v1/sizing`` and the console's Admin page): the model
``deeppod size`` runs, for administrators and tenant admins, bounded so that one request
cannot hold the server: the simulator replays at most MAX_ARRIVALS runs on at most
MAX_SIMULATED_GPUS; past either the answer is the arithmetic alone, and says so."""

from __future__ import annotations

from dataclasses import replace

from deeppod.auth import roles
from deeppod.errors import Forbidden
from deeppod.sizing.model import DAYS, Recommendation, Workload, size

MAX_ARRIVALS = 20_000
MAX_SIMULATED_GPUS = 4096


def check_may(principal) -> None:
    if principal.role not in (roles.ADMIN, roles.TENANT_ADMIN):
        raise Forbidden("sizing a cluster is for administrators and tenant admins; 'deeppod size' gives the same "
                        "answer on your own machine")


def recommend(principal, workload: Workload) -> Recommendation:
    check_may(principal)
    rough = size(replace(workload, simulate=False))  # arithmetic only: at once
    if not workload.simulate:
        return rough
    arrivals = DAYS * workload.users * workload.runs_per_user_day
    if arrivals > MAX_ARRIVALS or rough.training_gpus > MAX_SIMULATED_GPUS:
        rough.why.append(f"the wait was not simulated here ({arrivals:,.0f} runs on {rough.training_gpus:,} GPUs; the "
                         f"server replays at most {MAX_ARRIVALS:,} runs on {MAX_SIMULATED_GPUS:,}): 'deeppod size' "
                         "simulates any size on your own machine")
        return rough
    return size(workload)

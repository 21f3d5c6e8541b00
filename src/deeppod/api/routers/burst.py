from fastapi import APIRouter, Request

from deeppod.api.deps import PrincipalDep, SessionDep, get_ctx
from deeppod.api.schemas.burst import BurstOut
from deeppod.plans.burst_status import burst_status

router = APIRouter(prefix="/v1/burst", tags=["nodes"])


@router.get("", response_model=BurstOut)
def status(request: Request, session: SessionDep, principal: PrincipalDep) -> BurstOut:
    """Burst node types, the nodes up and asked for, and what each tenant was charged."""
    got = burst_status(session, principal, get_ctx(request).jobs.bursting.known_asks)
    return BurstOut.model_validate({"types": got.types, "charges": got.charges, "budgets": got.budgets})

from functools import partial

from fastapi import APIRouter, Request

from deeppod.api.deps import PrincipalDep, get_ctx
from deeppod.api.hangup import in_thread_until_gone
from deeppod.api.schemas.sizing import SizingIn, SizingOut
from deeppod.sizing import Workload, service

router = APIRouter(prefix="/v1/sizing", tags=["sizing"])


@router.post("", response_model=SizingOut)
async def recommend(body: SizingIn, principal: PrincipalDep, request: Request) -> SizingOut:
    """GPUs, nodes, cores per GPU and storage for a workload, each with its reason (as
    ``deeppod size``; docs/scheduler.md, "Sizing"). Changes nothing. Its simulations are bounded
    (sizing/service.py) and given up when the client hangs up."""
    within = partial(service.recommend, budget_s=get_ctx(request).settings.sizing_budget_seconds)
    r = await in_thread_until_gone(request, within, principal, Workload(**body.model_dump()))
    return SizingOut(**r.as_dict())

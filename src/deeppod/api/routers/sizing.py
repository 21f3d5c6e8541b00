from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from deeppod.api.deps import PrincipalDep
from deeppod.api.schemas.sizing import SizingIn, SizingOut
from deeppod.sizing import Workload, service

router = APIRouter(prefix="/v1/sizing", tags=["sizing"])


@router.post("", response_model=SizingOut)
async def recommend(body: SizingIn, principal: PrincipalDep) -> SizingOut:
    """GPUs, nodes, cores per GPU and storage for a workload, each with its reason (as
    ``deeppod size``; docs/scheduler.md, "Sizing"). Changes nothing."""
    r = await run_in_threadpool(service.recommend, principal, Workload(**body.model_dump()))
    return SizingOut(**r.as_dict())

from dataclasses import asdict

from fastapi import APIRouter, Request

from deeppod.api.deps import PrincipalDep, SessionDep, get_ctx
from deeppod.api.schemas.plans import PlanIn, PlanOut, TenantStatusOut
from deeppod.cluster import burst
from deeppod.plans import service

router = APIRouter(prefix="/v1/plan", tags=["plan"])


def _out(session, principal) -> PlanOut:
    plan, row = service.current_plan(session)
    return PlanOut(plan=plan.to_dict(), applied_at=row.applied_at if row else None,
                   applied_by=row.applied_by if row else None,
                   tenants=[TenantStatusOut(**asdict(s)) for s in service.plan_status(session, principal)])


@router.get("", response_model=PlanOut)
def show(session: SessionDep, principal: PrincipalDep) -> PlanOut:
    return _out(session, principal)


@router.put("", response_model=PlanOut)
def apply(body: PlanIn, request: Request, session: SessionDep, principal: PrincipalDep) -> PlanOut:
    row = service.apply_plan(session, principal, body.model_dump(exclude_none=True))
    out = _out(session, principal)
    out.warnings = burst.plan_warnings(row.document, get_ctx(request).jobs.bursting)
    return out

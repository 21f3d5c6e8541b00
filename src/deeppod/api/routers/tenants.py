from fastapi import APIRouter, Request

from deeppod.api.deps import PrincipalDep, SessionDep, get_ctx
from deeppod.api.schemas.tenants import TenantCreate, TenantOut
from deeppod.auth import service

router = APIRouter(prefix="/v1/tenants", tags=["tenants"])


@router.post("", status_code=201, response_model=TenantOut)
def create(body: TenantCreate, session: SessionDep, principal: PrincipalDep, request: Request) -> TenantOut:
    isolated = get_ctx(request).settings.isolation != "one-tenant"
    return TenantOut.model_validate(service.create_tenant(session, principal, body.name, isolated=isolated))


@router.get("", response_model=list[TenantOut])
def list_tenants(session: SessionDep, principal: PrincipalDep) -> list[TenantOut]:
    return [TenantOut.model_validate(t) for t in service.list_tenants(session, principal)]

from fastapi import APIRouter, Request

from deeppod.api.deps import PrincipalDep, SessionDep, get_ctx
from deeppod.api.schemas.users import UserCreate, UserCreated, UserOut, UserPatch
from deeppod.auth import service

router = APIRouter(prefix="/v1", tags=["users"])


def _out(user, tenant: str) -> dict:
    return {"id": user.id, "name": user.name, "tenant": tenant, "role": user.role, "is_admin": user.is_admin,
            "created_at": user.created_at}


@router.post("/users", status_code=201, response_model=UserCreated)
def create(body: UserCreate, session: SessionDep, principal: PrincipalDep) -> UserCreated:
    user, secret = service.create_user(session, principal, body.name, body.tenant,
                                       "admin" if body.admin else body.role)
    return UserCreated(**_out(user, body.tenant), token=secret)


@router.get("/users", response_model=list[UserOut])
def list_users(session: SessionDep, principal: PrincipalDep) -> list[UserOut]:
    return [UserOut(**_out(u, t.name)) for u, t in service.list_users(session, principal)]


@router.patch("/users/{name}", response_model=UserOut)
def update(name: str, body: UserPatch, session: SessionDep, principal: PrincipalDep) -> UserOut:
    user, tenant = service.set_role(session, principal, name, body.role)
    return UserOut(**_out(user, tenant.name))


@router.get("/whoami")
def whoami(principal: PrincipalDep, request: Request) -> dict:
    """Who the token is, and where this server lets the caller's jobs work: ``work_roots``
    (sandbox isolation: only there, or in code sent with the job; null: anywhere)."""
    ctx = get_ctx(request)
    return {"user": principal.user, "tenant": principal.tenant, "is_admin": principal.is_admin,
            "role": principal.role, "scope": principal.scope, "job_id": principal.job_id,
            "isolation": ctx.settings.isolation,
            "work_roots": ctx.roots.of(principal.tenant) if ctx.roots is not None else None}

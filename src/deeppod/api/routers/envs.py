from dataclasses import asdict

from fastapi import APIRouter, Request

from deeppod.api.deps import PrincipalDep, SessionDep, get_ctx
from deeppod.api.schemas.envs import EnvOut, PruneEnvsIn, PruneEnvsOut
from deeppod.envs import service

router = APIRouter(prefix="/v1/envs", tags=["envs"])


def _out(e: service.EnvInfo) -> EnvOut:
    return EnvOut(**{k: v for k, v in asdict(e).items() if k != "path"})


@router.get("", response_model=list[EnvOut])
def list_envs(request: Request, session: SessionDep, principal: PrincipalDep) -> list[EnvOut]:
    return [_out(e) for e in service.list_envs(session, principal, get_ctx(request).settings.envs_root)]


@router.delete("/{key}", response_model=EnvOut)
def remove(key: str, request: Request, session: SessionDep, principal: PrincipalDep) -> EnvOut:
    return _out(service.remove(session, principal, get_ctx(request).settings.envs_root, key))


@router.post("/prune", response_model=PruneEnvsOut)
def prune(body: PruneEnvsIn, request: Request, session: SessionDep, principal: PrincipalDep) -> PruneEnvsOut:
    return PruneEnvsOut(removed=service.prune(session, get_ctx(request).settings.envs_root, body.keep_bytes,
                                              principal))

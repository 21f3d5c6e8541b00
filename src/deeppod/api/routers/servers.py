from fastapi import APIRouter

from deeppod.api.deps import PrincipalDep, SessionDep
from deeppod.api.schemas.servers import ServerOut
from deeppod.cluster import leader

router = APIRouter(prefix="/v1/servers", tags=["servers"])


@router.get("", response_model=list[ServerOut])
def list_servers(session: SessionDep, principal: PrincipalDep) -> list[ServerOut]:
    return [ServerOut(**sv) for sv in leader.list_servers(session)]

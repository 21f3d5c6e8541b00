from fastapi import APIRouter

from deeppod.api.deps import PrincipalDep, SessionDep
from deeppod.api.schemas.nodes import NodeHealth, NodeOut, node_out
from deeppod.cluster import service

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


@router.get("", response_model=list[NodeOut])
def list_nodes(session: SessionDep, principal: PrincipalDep) -> list[NodeOut]:
    use = service.usage(session)
    return [node_out(n, use.get(n.name)) for n in service.list_nodes(session)]


@router.patch("/{name}", response_model=NodeOut)
def set_health(name: str, body: NodeHealth, session: SessionDep, principal: PrincipalDep) -> NodeOut:
    node = service.set_health(session, principal, name, body.healthy, body.gpu)
    return node_out(node, service.usage(session).get(node.name))

from fastapi import APIRouter

from deeppod.api.deps import Id, PrincipalDep, SessionDep
from deeppod.api.schemas.tokens import TokenCreate, TokenCreated, TokenOut
from deeppod.auth import service

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


@router.post("", status_code=201, response_model=TokenCreated)
def create(body: TokenCreate, session: SessionDep, principal: PrincipalDep) -> TokenCreated:
    token, secret = service.create_token(session, principal, body.name, body.user, scope=body.scope,
                                         expires_in=body.expires_in)
    return TokenCreated(id=token.id, name=token.name, scope=token.scope, created_at=token.created_at,
                        expires_at=token.expires_at, user=body.user or principal.user, token=secret)


@router.get("", response_model=list[TokenOut])
def list_tokens(session: SessionDep, principal: PrincipalDep) -> list[TokenOut]:
    return [TokenOut.model_validate(t) for t in service.list_tokens(session, principal)]


@router.delete("/{token_id}", status_code=204)
def revoke(token_id: Id, session: SessionDep, principal: PrincipalDep) -> None:
    service.revoke_token(session, principal, token_id)

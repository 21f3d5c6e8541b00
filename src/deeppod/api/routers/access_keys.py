from fastapi import APIRouter, Request

from deeppod.api.deps import PrincipalDep, SessionDep
from deeppod.api.schemas.access_keys import AccessKeyCreate, AccessKeyCreated, AccessKeyOut
from deeppod.s3 import access_keys as service
from deeppod.s3.app import endpoint_of

router = APIRouter(prefix="/v1/access-keys", tags=["access-keys"])


@router.post("", status_code=201, response_model=AccessKeyCreated)
def create(body: AccessKeyCreate, request: Request, session: SessionDep, principal: PrincipalDep) -> AccessKeyCreated:
    """An S3 access key for the caller (docs/datasets.md, "S3"): the secret is shown once."""
    key, secret = service.create(session, principal, scope=body.scope, name=body.name, expires_in=body.expires_in)
    return AccessKeyCreated(key_id=key.key_id, name=key.name, scope=key.scope, created_at=key.created_at,
                            expires_at=key.expires_at, secret=secret, endpoint=endpoint_of(request))


@router.get("", response_model=list[AccessKeyOut])
def list_keys(session: SessionDep, principal: PrincipalDep) -> list[AccessKeyOut]:
    return [AccessKeyOut.model_validate(k) for k in service.list_keys(session, principal)]


@router.delete("/{key_id}", status_code=204)
def revoke(key_id: str, session: SessionDep, principal: PrincipalDep) -> None:
    service.revoke(session, principal, key_id)

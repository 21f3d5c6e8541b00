from datetime import datetime

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict


class TenantCreate(Strict):
    name: str = Field(max_length=63)


class TenantOut(Out):
    id: int
    name: str
    created_at: datetime

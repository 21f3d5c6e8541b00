from datetime import datetime

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict


class UserCreate(Strict):
    name: str = Field(max_length=63)
    tenant: str = Field(max_length=63)
    admin: bool = False


class UserOut(Out):
    id: int
    name: str
    tenant: str
    is_admin: bool
    created_at: datetime


class UserCreated(UserOut):
    token: str = Field(description="the user's first token; shown once")

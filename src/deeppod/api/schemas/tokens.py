from datetime import datetime

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict


class TokenCreate(Strict):
    name: str = Field(default="", max_length=128)
    user: str | None = Field(default=None, description="admins only: create it for this user")


class TokenOut(Out):
    id: int
    name: str
    created_at: datetime


class TokenCreated(TokenOut):
    user: str
    token: str = Field(description="the secret; shown once, stored only as a hash")

from datetime import datetime
from typing import Literal

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict


class TokenCreate(Strict):
    name: str = Field(default="", max_length=128)
    user: str | None = Field(default=None, description="admins (tenant admins: in their tenants) only: "
                                                       "create it for this user")
    scope: Literal["all", "read", "predict"] = Field(default="all", description="all: what the role allows; "
                                                     "read: GET only; predict: predictions only")
    expires_in: float | None = Field(default=None, ge=60, le=5 * 366 * 86400,
                                     description="seconds until it stops working; none: until revoked")


class TokenOut(Out):
    id: int
    name: str
    scope: str
    created_at: datetime
    expires_at: datetime | None = None


class TokenCreated(TokenOut):
    user: str
    token: str = Field(description="the secret; shown once, stored only as a hash")

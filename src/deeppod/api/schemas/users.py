from datetime import datetime
from typing import Literal

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict


class UserCreate(Strict):
    name: str = Field(max_length=63)
    tenant: str = Field(max_length=63)
    role: Literal["admin", "tenant-admin", "member", "viewer"] = "member"
    admin: bool = Field(default=False, description="the same as role 'admin' (kept for older clients)")


class UserPatch(Strict):
    role: Literal["admin", "tenant-admin", "member", "viewer"]


class UserOut(Out):
    id: int
    name: str
    tenant: str
    role: str
    is_admin: bool
    created_at: datetime


class UserCreated(UserOut):
    token: str = Field(description="the user's first token; shown once")

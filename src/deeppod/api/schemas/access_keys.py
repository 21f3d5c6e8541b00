from datetime import datetime
from typing import Literal

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict


class AccessKeyCreate(Strict):
    name: str = Field(default="", max_length=128)
    scope: Literal["read", "write"] = Field(default="write", description="read: GET, HEAD and LIST; write: also "
                                                                         "PUT, DELETE and uploads to inboxes")
    expires_in: float | None = Field(default=None, ge=60, le=5 * 366 * 86400,
                                     description="seconds until it stops working; none: until revoked")


class AccessKeyOut(Out):
    key_id: str
    name: str
    scope: str
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None


class AccessKeyCreated(AccessKeyOut):
    secret: str = Field(description="the secret access key; shown once, stored nowhere")
    endpoint: str = Field(description="the S3 endpoint URL to give a client (path-style)")

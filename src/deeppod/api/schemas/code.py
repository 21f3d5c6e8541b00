from pydantic import Field

from deeppod.api.schemas.base import Out


class CodeOut(Out):
    digest: str = Field(description="the SHA-256 of the archive: pass it as a job's 'code'")
    bytes: int
    files: int

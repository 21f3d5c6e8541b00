from __future__ import annotations

from pydantic import Field

from deeppod.api.schemas.base import Out


class ImageOut(Out):
    name: str = Field(description="what a job names with --image")
    archive_bytes: int
    key: str = Field(description="its entry in the environment cache once unpacked ('deeppod envs ls')")
    unpacked: bool = Field(description="unpacked on this node already: a job in it starts without unpacking")

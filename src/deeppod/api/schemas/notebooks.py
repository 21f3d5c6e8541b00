from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict
from deeppod.contract import JobState
from deeppod.notebooks import service


class NotebookCreate(Strict):
    name: str | None = Field(default=None, max_length=128)
    gpus_per_worker: int | None = Field(default=None, ge=0, le=64,
                                        description="default: 1 when the cluster has GPUs, else 0")
    cpus_per_worker: float | None = Field(default=None, gt=0, le=1024)
    memory_mb_per_worker: int | None = Field(default=None, ge=1)
    requirements: str | None = Field(default=None, max_length=65536,
                                     description="a requirements.txt's text: the notebook's own environment "
                                                 "(JupyterLab comes from the server's)")
    python: str | None = Field(default=None, max_length=16)
    image: str | None = Field(default=None, max_length=128,
                              description="a container image this server offers; it must hold JupyterLab")
    datasets: list[str] = Field(default_factory=list, max_length=16)
    network: Literal["host", "isolated", "none"] | None = None
    priority: int = Field(default=0, ge=-1000, le=1000)
    idle_seconds: float | None = Field(default=None, gt=0, le=365 * 86400,
                                       description="stopped after this long without kernel or terminal activity; "
                                                   "default: the plan's notebook_idle_hours, else the server's")


class NotebookResume(Strict):
    idle_seconds: float | None = Field(default=None, gt=0, le=365 * 86400)


class NotebookOut(Out):
    id: int
    name: str
    tenant: str
    user: str
    state: JobState
    reason: str
    stop_reason: str | None
    gpus_per_worker: int
    idle_limit_seconds: float | None
    url: str = Field(description="its path on this server (JupyterLab): open it signed in to the console, or "
                                 "send a token of its owner")
    submitted_at: datetime
    started_at: datetime | None
    ended_at: datetime | None


def notebook_out(job, tenant: str, user: str) -> NotebookOut:
    return NotebookOut.model_validate({**{c: getattr(job, c) for c in NotebookOut.model_fields if hasattr(job, c)},
                                       "tenant": tenant, "user": user, "url": service.url(job.id)})

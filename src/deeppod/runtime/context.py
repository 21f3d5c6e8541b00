"""The job contract as seen from inside a worker."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class JobContext:
    job_id: int | None
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    checkpoint_dir: str | None
    api_url: str | None
    restart_count: int

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


def job_context(env: dict | None = None) -> JobContext:
    """Read the job contract from the environment (defaults: a single local process)."""
    env = os.environ if env is None else env
    job_id = env.get("DEEPPOD_JOB_ID")
    return JobContext(
        job_id=int(job_id) if job_id else None,
        rank=int(env.get("RANK", 0)),
        local_rank=int(env.get("LOCAL_RANK", 0)),
        world_size=int(env.get("WORLD_SIZE", 1)),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
        checkpoint_dir=env.get("DEEPPOD_CHECKPOINT_DIR"),
        api_url=env.get("DEEPPOD_API_URL"),
        restart_count=int(env.get("DEEPPOD_RESTART_COUNT", 0)),
    )

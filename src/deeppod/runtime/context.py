"""The job contract as seen from inside a worker, and ``init()``."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

from deeppod.contract import ENV_API_URL, ENV_CHECKPOINT_DIR, ENV_JOB_ID, ENV_JOINING, ENV_RESTART_COUNT


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
    device: object = "cpu"  # a torch.device after init()
    backend: str | None = None

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def job_dir(self) -> Path | None:
        """The job's folder on the node (the checkpoint folder's parent)."""
        return Path(self.checkpoint_dir).parent if self.checkpoint_dir else None


def job_context(env: dict | None = None) -> JobContext:
    """Read the job contract from the environment (defaults: a single local process)."""
    env = os.environ if env is None else env
    job_id = env.get(ENV_JOB_ID)
    return JobContext(
        job_id=int(job_id) if job_id else None,
        rank=int(env.get("RANK", 0)),
        local_rank=int(env.get("LOCAL_RANK", 0)),
        world_size=int(env.get("WORLD_SIZE", 1)),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
        checkpoint_dir=env.get(ENV_CHECKPOINT_DIR),
        api_url=env.get(ENV_API_URL),
        restart_count=int(env.get(ENV_RESTART_COUNT, 0)),
    )


def init(backend: str | None = None, timeout_seconds: float = 1800.0) -> JobContext:
    """Join the job: NCCL with CUDA, gloo otherwise; bind this worker's local GPU; catch
    SIGTERM for graceful stops. Works the same outside DeepPod (one process, no env)."""
    import torch
    import torch.distributed as dist

    from deeppod.runtime import stop

    ctx = job_context()
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        device = torch.device("cuda", ctx.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = backend or "nccl"
    else:
        device = torch.device("cpu")
        backend = backend or "gloo"
    # A worker joining a running job (an in-place grow) meets the others in runtime.Resizer,
    # once its model is built: they keep training until then.
    joining = os.environ.get(ENV_JOINING) == "1"
    if ctx.world_size > 1 and not dist.is_initialized() and not joining:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_seconds))  # env:// rendezvous
    stop.install()
    return replace(ctx, device=device, backend=backend)

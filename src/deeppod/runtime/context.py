"""The job contract as seen from inside a worker, and ``init()``."""

from __future__ import annotations

import os
import socket
import time
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


def wait_for_store(addr: str, port: int, timeout_seconds: float) -> None:
    """Until rank 0's rendezvous store listens at ``addr:port`` (or the time is up). torch's
    store client retries a refused connection with a growing back-off: a worker that came
    before rank 0 listened would lose up to half a second to it, at every start and every
    in-place switch. A refused connect costs microseconds: poll every 5 ms instead."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, int(port)), timeout=1.0) as sock:
                # On loopback a connect can meet itself (the kernel picked the port as its own
                # source port, within minutes of polling): that is no store.
                if sock.getsockname() != sock.getpeername():
                    return
        except OSError:
            pass
        time.sleep(0.005)


def before_groups() -> None:
    """Import torch.distributed.nn now: it captures group.WORLD when imported, past its destroy."""
    import torch.distributed.nn  # noqa: F401


def init(backend: str | None = None, timeout_seconds: float = 1800.0) -> JobContext:
    """Join the job: NCCL with CUDA, gloo otherwise; bind this worker's local GPU; catch
    SIGTERM for graceful stops. Works the same outside DeepPod (one process, no env)."""
    import torch
    import torch.distributed as dist

    from deeppod.runtime import spare, stop

    before_groups()
    if spare.is_spare():  # a warm spare: torch is imported; wait here to become a new worker
        spare.await_assignment()
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:  # its CPU request (OpenMP read the spare's at import)
            torch.set_num_threads(int(threads))
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
        if ctx.rank != 0 and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            wait_for_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout_seconds)
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_seconds))  # env:// rendezvous
    stop.install()
    return replace(ctx, device=device, backend=backend)

"""The job contract: the environment every worker gets (docs/jobs.md).

The torchrun variables make an unmodified ``torch.distributed`` script work; the
``DEEPPOD_*`` ones give it the platform.
"""

from __future__ import annotations

import re

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK", "CUDA_VISIBLE_DEVICES")
RESERVED_PREFIX = "DEEPPOD_"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Server-side variables that must not leak into user jobs.
_SERVER_ONLY = re.compile(r"^(DEEPPOD_|PYTEST_)")


def reserved(name: str) -> bool:
    return name in TORCHRUN_VARS or name.startswith(RESERVED_PREFIX)


def base_environment(server_env: dict[str, str]) -> dict[str, str]:
    """What a worker inherits from the host before the job's own variables."""
    return {k: v for k, v in server_env.items() if not _SERVER_ONLY.match(k)}


def worker_env(
    base: dict[str, str],
    user_env: dict[str, str],
    *,
    job_id: int,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
    gpus: tuple[int, ...],
    cpus: float,
    checkpoint_dir: str,
    api_url: str,
    token: str,
    restart_count: int = 0,
) -> dict[str, str]:
    env = dict(base)
    env.update(user_env)
    threads = str(max(1, int(cpus)))
    # Honour the CPU request: math libraries size their thread pools from these.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if var not in user_env:
            env[var] = threads
    env.setdefault("PYTHONUNBUFFERED", "1")  # logs stream live
    env.update({
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(node_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        # A job only ever sees the GPUs it was given; none if it asked for none.
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # NVML's index order
        "DEEPPOD_JOB_ID": str(job_id),
        "DEEPPOD_CHECKPOINT_DIR": checkpoint_dir,
        "DEEPPOD_API_URL": api_url,
        "DEEPPOD_TOKEN": token,
        "DEEPPOD_RESTART_COUNT": str(restart_count),
    })
    return env

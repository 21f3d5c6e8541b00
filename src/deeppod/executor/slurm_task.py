"""One worker of a job on Slurm: ``python -m deeppod.executor.slurm_task JOB_DIR``, one per
Slurm task (``srun`` starts them; SLURM_PROCID is the rank).

It runs as the job's identity inside Slurm's allocation and cgroups. The worker's environment
is the job contract of its spec, with what only Slurm knows at the start: the rendezvous (the
batch step's node and port), the rank's place on its node and the GPUs Slurm bound to the task.
A stop (SIGTERM, from ``scancel``) goes to the worker's own process only, so it can finish its
step and checkpoint; after the job's grace period whatever is left of it is killed. Its exit code
goes to ``exit/rank-R`` and is the task's.

Standard library only: it starts in every task.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from deeppod.contract import ENV_NODE_ADDRESS
from deeppod.envs import build as envs
from deeppod.envs import images
from deeppod.executor import rootless
from deeppod.job_folder import JobFolder

POLL_S = 0.1
MARK_S = 0.5


def tasks_per_node(value: str) -> list[int]:
    """SLURM_STEP_TASKS_PER_NODE ("2(x3),1") as one count per node."""
    counts = []
    for part in value.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


NODE_ADDRS = "DEEPPOD_SLURM_NODE_ADDRS"  # the batch step's word to its tasks: {node: NodeAddr}, as JSON
_NODE = re.compile(r"^NodeName=(\S+).*?\bNodeAddr=(\S+)", re.M)


def parse_node_addrs(scontrol: str) -> dict[str, str]:
    """``scontrol show node -o``'s lines as {node: the address Slurm reaches it at}."""
    return {m.group(1): m.group(2) for m in _NODE.finditer(scontrol)}


def node_addrs(nodes: str) -> dict[str, str]:
    """The nodes of a Slurm host list ("gpu[01-04]") and their NodeAddr, in one call of scontrol."""
    return parse_node_addrs(subprocess.run(["scontrol", "show", "node", nodes, "-o"],
                                           capture_output=True, text=True).stdout)


def node_addr(node: str, known: dict[str, str] | None = None) -> str:
    """The address Slurm reaches ``node`` at (NodeAddr; its name if none): from ``known`` (what
    the batch step looked up for the whole allocation) where it is there, else from scontrol."""
    if known and node in known:
        return known[node]
    return node_addrs(node).get(node, node)


def task_env(worker_env: dict[str, str], environ: dict[str, str], gpus_per_worker: int,
             node_address: str = "") -> dict[str, str]:
    """The worker's environment: its contract, Slurm's own variables, and the places Slurm chose."""
    env = dict(worker_env)
    env.update({k: v for k, v in environ.items() if k.startswith("SLURM")})
    node = int(environ.get("SLURM_NODEID", "0"))
    per_node = tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE", "1"))
    env.update({
        "MASTER_ADDR": environ["DEEPPOD_SLURM_MASTER_ADDR"],
        "MASTER_PORT": environ["DEEPPOD_SLURM_MASTER_PORT"],
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": str(per_node[node] if node < len(per_node) else 1),
        "GROUP_RANK": str(node),
        # the GPUs Slurm bound to this task (--gpus-per-task); none if it asked for none
        "CUDA_VISIBLE_DEVICES": environ.get("CUDA_VISIBLE_DEVICES", "") if gpus_per_worker else "",
    })
    if node_address:  # as DeepPod lists the node (sinfo's NodeAddr): where a replica listens and says it does
        env[ENV_NODE_ADDRESS] = node_address
    return env


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def load(argv: list[str], module: str) -> tuple[JobFolder, dict] | None:
    """``JOB_DIR``'s folder and the job's Slurm spec; None (after saying how to call it) otherwise."""
    if len(argv) != 2:
        print(f"usage: python -m deeppod.executor.{module} JOB_DIR", file=sys.stderr)
        return None
    folder = JobFolder(Path(argv[1]))
    return folder, json.loads(folder.slurm_spec().read_text())


def main(argv: list[str]) -> int:
    if (loaded := load(argv, "slurm_task")) is None:
        return 2
    folder, spec = loaded
    rank = int(os.environ["SLURM_PROCID"])
    worker = spec["workers"][rank]
    node = os.environ.get("SLURMD_NODENAME", "")
    known = json.loads(os.environ.get(NODE_ADDRS) or "{}")
    env = task_env(worker["env"], dict(os.environ), int(spec.get("gpus_per_worker", 0)),
                   node and node_addr(node, known))
    order, enter, gpus = spec.get("env") or {}, None, bool(env["CUDA_VISIBLE_DEVICES"])
    if order.get("image"):  # a container image (unpacked before the job went to Slurm), entered rootless
        env = images.activate(order, env, gpus)
        enter = in_image(str(images.image_path(order)), spec.get("binds") or [], spec["workdir"], gpus)
    elif order:  # its own Python environment first (built before the job went to Slurm)
        env = envs.activate(order, env)
    grace = float(spec.get("grace_seconds", 30.0))
    # where Slurm put it, for the job's page (the server checks the node against Slurm's word)
    folder.node_file(rank).write_text(json.dumps({"node": node,
                                                  "gpus": env["CUDA_VISIBLE_DEVICES"]}))
    stop_at: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: stop_at.append(time.monotonic()))
    signal.signal(signal.SIGINT, lambda *_: stop_at.append(time.monotonic()))
    with open(folder.log(rank), "ab", buffering=0) as log:  # made for it, the job's to write
        try:
            proc = subprocess.Popen(spec["command"], cwd="/" if enter else spec["workdir"], env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=enter)
        except OSError as exc:
            log.write(f"could not start the worker: {exc}\n".encode())
            folder.exit_file(rank).write_text("127")
            return 127
    told, marked, next_mark = False, 0, 0.0
    while (code := proc.poll()) is None:
        now = time.monotonic()
        if stop_at and not told:
            told = True
            os.kill(proc.pid, signal.SIGTERM)  # its own process: its loader workers go with it
        if stop_at and now - stop_at[0] > grace:
            _kill_group(proc.pid)
        if now >= next_mark:
            next_mark = now + MARK_S
            marked = folder.stamp_log(rank, marked)
        time.sleep(POLL_S)
    _kill_group(proc.pid)  # what it left behind goes with it
    folder.stamp_log(rank, marked)
    folder.exit_file(rank).write_text(str(code))
    return _exit_status(code)


def in_image(image: str, binds: list, workdir: str, gpus: bool):
    """What the worker's child does before its exec to run in its image (executor/rootless.py): a
    step that fails says why in the worker's log and ends it with 126, as the sandbox does."""
    def enter() -> None:
        try:
            rootless.enter(image, binds, workdir, gpus)
        except OSError as exc:
            os.write(2, f"deeppod: cannot run the job in its image: {exc}\n".encode())
            os._exit(126)
    return enter


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv))

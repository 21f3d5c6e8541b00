"""A job's batch step on Slurm: ``python -m deeppod.executor.slurm_job JOB_DIR``, the whole of the
batch script DeepPod submits. It runs on the allocation's first node as the job's identity.

It picks the rendezvous there (rank 0 runs on this node: Slurm places task 0 on the batch
host), starts every worker with one ``srun`` (executor/slurm_task.py), and when one worker
fails stops the others (SIGTERM to the step; each task gives its worker the job's grace). At the
end it writes ``result.json``: the exit codes, why the run ended, whether DeepPod asked for the
stop, whether the time limit's word (USR1, sbatch --signal) stopped it. A run that Slurm itself
ended (its time, a preemption, a requeue, a node lost) writes no result: the executor reads
Slurm's word on it instead.

Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from deeppod.contract import EXIT_RESUME, describe_exit, free_port
from deeppod.executor.slurm_task import NODE_ADDRS, load, node_addr, node_addrs
from deeppod.job_folder import JobFolder

POLL_S = 0.2
_OOM = re.compile(rb"task (\d+): Out Of Memory")


def node_address(node: str, known: dict[str, str] | None = None) -> str:
    """The address Slurm reaches ``node`` at (its NodeAddr), where the workers meet rank 0."""
    addr = node_addr(node, known)
    try:
        return socket.gethostbyname(addr)
    except OSError:
        return addr


def main(argv: list[str]) -> int:
    if (loaded := load(argv, "slurm_job")) is None:
        return 2
    folder, spec = loaded
    ended_by_slurm: list[int] = []  # a signal to the batch step itself: Slurm ends the whole run
    signal.signal(signal.SIGTERM, lambda sig, _: ended_by_slurm.append(sig))
    time_up: list[int] = []  # sbatch --signal=B:USR1: the time limit is near, the workers stop as at a stop
    signal.signal(signal.SIGUSR1, lambda sig, _: time_up.append(sig))
    for rank in range(len(spec["workers"])):  # a requeued run starts clean
        folder.exit_file(rank).write_text("")
        folder.node_file(rank).write_text("")
    here = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    known = node_addrs(os.environ.get("SLURM_JOB_NODELIST") or here)  # once for every task of the run
    address = node_address(here, known)
    env = {**os.environ, "DEEPPOD_SLURM_MASTER_ADDR": address, "DEEPPOD_SLURM_MASTER_PORT": str(free_port(address)),
           NODE_ADDRS: json.dumps(known)}
    srun = subprocess.Popen(["srun", "--export=ALL", "--kill-on-bad-exit=0", sys.executable, "-m",
                             "deeppod.executor.slurm_task", str(folder.root)],
                            env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    oom: set[int] = set()
    reader = threading.Thread(target=_relay, args=(srun.stderr, oom), daemon=True)
    reader.start()
    reason, told = "", False
    while srun.poll() is None:
        if time_up and not told:
            told = True
            _terminate_steps()
        if not reason:
            reason = _failed(folder, len(spec["workers"]), oom, bool(time_up))
            if reason:
                _terminate_steps()
        time.sleep(POLL_S)
    reader.join(timeout=5)
    codes = folder.exit_codes()
    final = _failed(folder, len(spec["workers"]), oom, bool(time_up))
    reason = final if oom else reason or final  # srun says 'Out Of Memory' after the task's end
    if ended_by_slurm and folder.read_stop() is None:
        return 0  # Slurm's own end of the run (time, preemption, requeue): the executor asks Slurm
    result = {"exit_codes": {str(r): c for r, c in sorted(codes.items())}, "reason": reason,
              "stopped": folder.read_stop() == "stop", "timed_out": bool(time_up) and folder.read_stop() is None,
              "ended_at": time.time()}
    with open(folder.result_file(), "w") as f:  # made for it: the job may not make files here
        f.write(json.dumps(result))
    return 0


def _terminate_steps() -> None:
    """SIGTERM to the job's tasks (not to this batch step, which waits for them to write their ends)."""
    subprocess.run(["scancel", "--signal=TERM", os.environ["SLURM_JOB_ID"]], capture_output=True)


def _failed(folder: JobFolder, workers: int, oom: set[int], time_up: bool = False) -> str:
    """Why the run ends early: the first worker that failed (a stop's or a time limit's 'resume me'
    is no failure)."""
    stopping = time_up or folder.read_stop() is not None
    for rank, code in sorted(folder.exit_codes().items()):
        if rank in oom:
            return f"rank {rank} ran out of memory (Slurm's limit for the job)"
        if code != 0 and not (code == EXIT_RESUME and stopping):
            return f"rank {rank} {describe_exit(code)}"
    return ""


def _relay(stream, oom: set[int]) -> None:
    """srun's own messages to the batch log, noting the tasks Slurm's cgroup killed for memory."""
    for line in stream:
        sys.stderr.buffer.write(line)
        sys.stderr.flush()
        if m := _OOM.search(line):
            oom.add(int(m.group(1)))


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The job contract: what the control plane, every executor, the CLI, the SDK and the code
inside jobs agree on (docs/jobs.md): job states, the environment each worker gets, the
exit code that asks for a resume, how an exit is described, the dataset shard format.

Standard library only: user jobs, the per-job supervisor and the CLI import it, and a
test checks that it stays so.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
import signal
import socket
import struct
from enum import StrEnum


class JobState(StrEnum):
    """A job's lifecycle::

        queued -> running -> succeeded | failed | cancelled | stopped
                  running -> preempted -> queued    (its GPUs went to another job)
                  running -> resizing  -> queued    (restarts with another worker count)
                  running -> pruned                 (a search trial its pruner stopped early)

    ``preempted`` and ``resizing`` hold their resources until the workers have stopped.
    A ``stopped`` job was stopped gracefully on request and can be resumed. Every legal move
    is in ``MOVES``; ``jobs.service.move`` makes them.
    """

    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"
    RESIZING = "resizing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"
    PRUNED = "pruned"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES

    @property
    def holds_resources(self) -> bool:
        return self in HOLDING_STATES


HOLDING_STATES = frozenset({JobState.RUNNING, JobState.PREEMPTED, JobState.RESIZING})
ACTIVE_STATES = HOLDING_STATES | {JobState.QUEUED}
FINAL_STATES = frozenset(JobState) - ACTIVE_STATES

# Every legal move of a job's state: the one table (jobs/service.move makes them and refuses
# the rest). A job that holds resources may be stopped for another reason while it stops
# (a preempted job resized, or ended by its own exit), and goes back to the queue or ends.
_ENDS = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.STOPPED, JobState.PRUNED})
MOVES: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.STOPPED, JobState.FAILED}),
    JobState.RUNNING: _ENDS | {JobState.PREEMPTED, JobState.RESIZING, JobState.QUEUED},
    JobState.PREEMPTED: _ENDS | {JobState.RESIZING, JobState.QUEUED},
    JobState.RESIZING: _ENDS | {JobState.PREEMPTED, JobState.QUEUED},
    JobState.STOPPED: frozenset({JobState.QUEUED}),  # resumed
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.PRUNED: frozenset(),
}


# --- the environment of a worker ---------------------------------------------------------
# torchrun's variables make an unmodified torch.distributed script work; DEEPPOD_* ones give
# it the platform.
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK", "CUDA_VISIBLE_DEVICES")
ENV_JOB_ID = "DEEPPOD_JOB_ID"  # the same across restarts
ENV_CHECKPOINT_DIR = "DEEPPOD_CHECKPOINT_DIR"  # survives restarts: save and resume here
ENV_API_URL = "DEEPPOD_API_URL"
ENV_TOKEN = "DEEPPOD_TOKEN"  # reaches only its own job's routes; revoked when the job ends
ENV_CA_CERT = "DEEPPOD_CA_CERT"  # the file to verify the server's TLS certificate with (when it is not a public CA's)
ENV_RESTART_COUNT = "DEEPPOD_RESTART_COUNT"
# a serving replica answers only the control plane, which sends this secret (its own per replica)
ENV_REPLICA_SECRET = "DEEPPOD_REPLICA_SECRET"
REPLICA_SECRET_HEADER = "X-DeepPod-Replica-Secret"
# the address other hosts reach the worker's node at, where a cluster's scheduler placed it (Slurm's
# NodeAddr): a replica listens there (else on 127.0.0.1, the one host of the local executor)
ENV_NODE_ADDRESS = "DEEPPOD_NODE_ADDRESS"
# direct predict (serve/direct.py): a client the control plane gave a signed token calls the
# replicas itself; every replica of a deployment checks it with the deployment's own key
ENV_DIRECT_KEY = "DEEPPOD_DIRECT_KEY"
ENV_DEPLOYMENT_ID = "DEEPPOD_DEPLOYMENT_ID"
DIRECT_TOKEN_PREFIX = "dpd1."
# seconds between the SIGTERM of a stop and the SIGKILL: how long the job has to checkpoint
ENV_GRACE = "DEEPPOD_GRACE_SECONDS"
# in-place resize (runtime/resize.py): the control plane's word on the job's world (JSON,
# read-only to the job), the generation a worker was started in, and "1" on a worker that
# joins a running job; the runtime answers in WORLD_ACK (in the checkpoint folder)
ENV_WORLD_FILE = "DEEPPOD_WORLD_FILE"
ENV_WORLD_GENERATION = "DEEPPOD_WORLD_GENERATION"
ENV_JOINING = "DEEPPOD_JOINING"
ENV_RESIZE_TIMEOUT = "DEEPPOD_RESIZE_TIMEOUT_SECONDS"
WORLD_ACK = ".world-ack.json"  # rank 0: {"generation", "world_size", "at"} after a step at the new size
RESIZABLE_MARK = ".resizable"  # rank 0 writes it when the job can resize in place
RESTART_MARK = ".resize-by-restart"  # or this, with why it resizes by a restart instead (a sharded model)
JOINER_READY = ".joiner-ready-{rank}"  # a joiner built its model and waits: now the others may switch
# a warm spare (runtime/spare.py): a worker process of a resizable job started before a grow
# needs it, parked in runtime.init() with its imports done; "N" (its number) in its env. Its
# stdin is a Unix socket: the supervisor sends the env of the worker it becomes, and that
# worker's log file
ENV_SPARE = "DEEPPOD_SPARE"
SPARE_PARKED = ".spare-parked-{n}"  # in the checkpoint folder while spare N waits
# metric points a process could not send before it exited (the control plane did not answer),
# one JSON point a line, in the checkpoint folder: the server takes them when the run ends
METRICS_SPOOL = ".metrics-unsent.jsonl"
DATA_ENV_PREFIX = "DEEPPOD_DATA_"  # + the dataset's name: the folder of its staged version
MODEL_ENV_PREFIX = "DEEPPOD_MODEL_"  # + a registered model's name: the folder of the version it reads
PARAM_ENV_PREFIX = "DEEPPOD_PARAM_"  # + a search parameter's name, upper case: a trial's value of it
ENV_TRIAL = "DEEPPOD_TRIAL"  # the trial number a search's job was started for
ENV_TRIAL_PARAMS = "DEEPPOD_TRIAL_PARAMS"  # that trial's parameters, as JSON (typed, unlike DEEPPOD_PARAM_*)
ENV_TRIAL_HOST = "DEEPPOD_TRIAL_HOST"  # "1": the search reuses this process for trial after trial
# the steps at which a trial's pruner decides ("1,3,9,..."; "*": every step; unset: none): a
# report at one of them is sent at once, and the answer carries the decision
ENV_TRIAL_JUDGED = "DEEPPOD_TRIAL_JUDGED"
JUDGED_EVERY_STEP = "*"  # ENV_TRIAL_JUDGED for a pruner that decides at every step (the median rule)
# the answer to a report at a rung: the leader holds it until its pruner decided, up to JUDGE_WAIT_S (a
# round takes milliseconds, seconds on a loaded host; a server that is not the leader answers at once),
# and the trial waits for it up to JUDGEMENT_WAIT_S, longer, so that it hears the decision unless the
# server fails over (it then goes on past its rung, once, which promotion cannot take back). Both
# under the runtime's send timeout (runtime.metrics.SEND_TIMEOUT_S); tests/test_contract.py checks it.
JUDGE_WAIT_S = 6.0
JUDGEMENT_WAIT_S = 9.0


def judged_between(judged: str, after: int, step: int) -> bool:
    """Whether the pruner decides on a step in (after, step]; ``judged`` as ENV_TRIAL_JUDGED
    says it (a trial that reports every few steps is judged at the first report past a rung).
    Called by runtime.report() on every step: the text is parsed once."""
    if not judged or step <= after:
        return False
    steps = _judged_steps(judged)
    if steps is None:
        return True
    i = bisect.bisect_right(steps, after)
    return i < len(steps) and steps[i] <= step


@functools.lru_cache(maxsize=8)
def _judged_steps(judged: str) -> tuple[int, ...] | None:
    """ENV_TRIAL_JUDGED's steps, sorted; None for "*" (every step)."""
    return None if judged == JUDGED_EVERY_STEP else tuple(sorted(int(j) for j in judged.split(",") if j.isdigit()))


# seconds between runtime.report()'s sends; a trial's pruner judges each report, so it sends sooner
ENV_METRICS_FLUSH = "DEEPPOD_METRICS_FLUSH_SECONDS"
TRIAL_METRICS_FLUSH_S = 0.2
RESERVED_PREFIX = "DEEPPOD_"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What a worker inherits from the server's environment: the programs' search path, the
# locale, the Python environment and the GPU stack's settings. Nothing else: the server's
# own variables (secrets, cloud keys, DEEPPOD_*) stay the server's.
_INHERITED = re.compile(r"^(PATH|HOME|LANG|LANGUAGE|LC_[A-Z]+|TZ|TERM|TMPDIR|PYTHONPATH|VIRTUAL_ENV|LD_LIBRARY_PATH"
                        r"|CUDA_HOME|NCCL_[A-Z_]+|NVIDIA_[A-Z_]+)$")


def tls_context(url: str, cafile: str | None = None):
    """None for http; for https a context trusting ``cafile`` (DEEPPOD_CA_CERT) or the system's."""
    return _ssl_context(cafile or None) if url.startswith("https:") else None


def server_urls(value: str | None) -> list[str]:
    """DEEPPOD_API_URL or ``--url``: a failover plane's servers, comma-separated; the first to answer."""
    return [u.strip().rstrip("/") for u in (value or "").split(",") if u.strip()]


def _not_connected(exc: BaseException) -> bool:
    """The request never reached a server (refused, no route, unknown name): safe to send to
    another one, whatever it was."""
    import errno
    import urllib.error

    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return isinstance(reason, (ConnectionRefusedError, socket.gaierror)) or (
        isinstance(reason, OSError) and reason.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH))


def open_first(urls: list[str], path: str, *, method: str, data: bytes | None, headers: dict, timeout: float,
               cafile: str | None) -> bytes:
    """The body of ``method path`` from the first of ``urls`` that takes the connection (a
    server that is down: the next one). An HTTP error answer is raised as is (HTTPError)."""
    import urllib.error
    import urllib.request

    if not urls:
        raise ValueError("no server URL")
    last: BaseException | None = None
    for base in urls:
        req = urllib.request.Request(base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=tls_context(base, cafile)) as r:
                return r.read()
        except urllib.error.HTTPError:
            raise
        except OSError as exc:
            if not _not_connected(exc):
                raise
            last = exc
    raise last


@functools.lru_cache(maxsize=8)
def _ssl_context(cafile: str | None):
    import ssl

    return ssl.create_default_context(cafile=cafile)


def reserved(name: str) -> bool:
    """A variable the platform sets: a job may not set it itself."""
    return name in TORCHRUN_VARS or name.startswith(RESERVED_PREFIX)


def param_env_key(name: str) -> str:
    """The variable that carries a trial's parameter: batch_size -> DEEPPOD_PARAM_BATCH_SIZE."""
    return PARAM_ENV_PREFIX + name.upper()


def dataset_env_key(name: str) -> str:
    """The variable that carries a staged dataset's folder: digits-v2@3 -> DEEPPOD_DATA_DIGITS_V2."""
    return DATA_ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", name.split("@")[0].split("/")[-1].upper())


def model_env_key(name: str) -> str:
    """The variable that carries a model version's folder: llama-tiny@3 -> DEEPPOD_MODEL_LLAMA_TINY."""
    return MODEL_ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", name.split("@")[0].split("/")[-1].upper())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now: the MASTER_PORT of a run."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def own_python_first(path: str) -> str:
    """``path`` (a PATH value) with the folder of the running Python first: a job's ``python`` is
    the one DeepPod (and torch) is installed in, even when a version manager's shim comes first
    in the shell (a shim is not there in a sandbox). Used by the CLI and the server alike."""
    import os
    import sys

    own = os.path.dirname(sys.executable)
    rest = [p for p in path.split(os.pathsep) if p and p != own]
    return os.pathsep.join([own, *rest] if own else rest)


def base_environment(server_env: dict[str, str]) -> dict[str, str]:
    """What a worker inherits from the host before the job's own variables. Its PATH is the
    server's without the folders under the server user's home (a version manager's, a user's own
    tools): the job's ``python`` stays the server's (:func:`own_python_first`), nothing else
    there is the job's to run, nor its to see."""
    env = {k: v for k, v in server_env.items() if _INHERITED.match(k)}
    if "PATH" in env:
        env["PATH"] = job_path(env["PATH"], server_env.get("HOME", ""))
    return env


def job_path(path: str, home: str) -> str:
    """``path`` without relative entries and those under ``home``, the running Python's folder kept first."""
    import os
    import sys

    own = os.path.dirname(sys.executable)
    home = home.rstrip("/")

    def private(d: str) -> bool:
        return not os.path.isabs(d) or (len(home) > 1 and (d == home or d.startswith(home + "/")))

    kept = [d for d in path.split(os.pathsep) if d and d != own and not private(d)]
    return os.pathsep.join([own, *kept] if own else kept)


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
    params: dict | None = None,
    grace_seconds: float | None = None,
) -> dict[str, str]:
    env = dict(base)
    env.update(user_env)
    env.update({param_env_key(k): str(v) for k, v in (params or {}).items()})
    if params is not None:
        env[ENV_TRIAL_PARAMS] = json.dumps(params)
        env.setdefault(ENV_METRICS_FLUSH, str(TRIAL_METRICS_FLUSH_S))
    threads = str(max(1, int(cpus)))
    # Honour the CPU request: math libraries size their thread pools from these.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if var not in user_env:
            env[var] = threads
    env.setdefault("PYTHONUNBUFFERED", "1")  # logs stream live
    # A worker killed by a fatal signal (a native crash, an abort in a C++ library) leaves every
    # thread's Python stack in its log, not just an exit code of -11 or -6.
    env.setdefault("PYTHONFAULTHANDLER", "1")
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
        ENV_JOB_ID: str(job_id),
        ENV_CHECKPOINT_DIR: checkpoint_dir,
        ENV_API_URL: api_url,
        ENV_TOKEN: token,
        ENV_RESTART_COUNT: str(restart_count),
    })
    if grace_seconds is not None:
        env[ENV_GRACE] = f"{grace_seconds:g}"
    return env


# --- how a worker ends -------------------------------------------------------------------
#: Exit code of a worker that stopped cleanly after a checkpoint and wants to be resumed
#: (75 is EX_TEMPFAIL in sysexits.h: "try again later"); not a failure.
EXIT_RESUME = 75


# the signals of a crash, on which a Python worker's fault handler (PYTHONFAULTHANDLER) logs its stacks
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL})


def describe_exit(code: int) -> str:
    """'exited with code 3', 'was killed by SIGKILL': how a worker's end reads in a reason."""
    if code < 0:
        try:
            sig = signal.Signals(-code)
            crash = "; a crash: a Python worker's log shows where, each thread's stack" if sig in CRASH_SIGNALS else ""
            return f"was killed by {sig.name}{crash}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# --- dataset shards ----------------------------------------------------------------------
# shards/shard-NNNNN.dps: SHARD_MAGIC, then records of SHARD_RECORD_HEADER (<u32 length><i32
# label>) and the sample's bytes. Written at ingest, read by the loader inside jobs.
SHARD_MAGIC = b"DPSHARD1"
SHARD_RECORD_HEADER = struct.Struct("<Ii")


def same_reason(a: str, b: str) -> bool:
    """Reasons that differ only in counts ("1 CPUs free") are one reason: events keep real changes."""
    return re.sub(r"\d+", "#", a) == re.sub(r"\d+", "#", b)

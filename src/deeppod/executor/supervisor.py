"""Per-job supervisor: ``python -m deeppod.executor.supervisor JOB_DIR``.

Runs in its own session so the job outlives the server. Starts every worker of the job
in its own process group, writes each worker's exit code to ``JOB_DIR/exit/rank-N`` as
it happens and ``JOB_DIR/result.json`` at the end. When one worker fails it stops the
others; on SIGTERM it stops all. A stop sends SIGTERM to each worker's own process only
(as Kubernetes and Docker do to a container's first process): its data-loader workers and
other children keep running, so the training process can finish its step and checkpoint.
After the grace period, or as soon as the worker's process exits, everything left in its
process group gets SIGKILL. It enforces the per-worker memory request by the resident size
of each worker's process group.

Standard library only: it must start fast and never import server code.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from deeppod.contract import ENV_SPARE, ENV_TOKEN, describe_exit
from deeppod.envs import build as envs
from deeppod.envs import images
from deeppod.executor import affinity, job_shm
from deeppod.executor.netns import Forward, JobNetwork
from deeppod.executor.sandbox import spare_may_become
from deeppod.job_folder import JobFolder

POLL_S = 0.05
LOG_MARK_S = 0.5  # how often each rank's log size is stamped with the time (logs/rank-N.marks)
MEMORY_CHECK_S = 0.5


def _signal_process(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_rss_mb(pgid: int) -> float:
    """Resident memory of every process in a process group, from /proc."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5 (pgrp), counted after the comm
                continue
            with open(f"/proc/{entry}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total / (1 << 20)


STOP_FILE_CHECK_S = 0.5
GROW_CHECK_S = 0.1
SPARE_EXIT_S = 1.0  # a spare told to go has this long to exit by itself
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies (on a Ray node,
    a node agent that dies takes its job's processes with it, as a machine that dies would)."""
    import ctypes
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# a spare has no rank, GPU or token until it is handed a worker's place (runtime/spare.py)
_RANKED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", ENV_TOKEN)


def spare_env(worker_env: dict[str, str], n: int) -> dict[str, str]:
    env = {k: v for k, v in worker_env.items() if k not in _RANKED}
    env["CUDA_VISIBLE_DEVICES"] = ""  # whatever it runs before it parks touches no one's GPU
    env[ENV_SPARE] = str(n)
    return env


def _heard(sock: socket.socket) -> bytes | None:
    """What a spare said on its socket ("parked"), b"" once it hung up, None while it says nothing."""
    try:
        return sock.recv(64, socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


class Supervisor:
    """``ranks``/``part``: on a cluster, the workers of one node (part N of the job), which
    write ``result-N.json``, die with the node agent that started them, and stop when
    ``JOB_DIR/stop`` (shared storage) appears: "stop" (asked for) or a reason (a worker
    elsewhere failed, a node was lost). Left out: every worker, here."""

    def __init__(self, job_dir: Path, ranks: set[int] | None = None, part: int | None = None):
        self.job_dir = job_dir
        self.folder = JobFolder(job_dir)
        self.spec = self.folder.read_spec()
        if ranks is not None:
            self.spec["workers"] = [w for w in self.spec["workers"] if int(w["rank"]) in ranks]
        self.part = part
        self.procs: dict[int, subprocess.Popen] = {}
        self.codes: dict[int, int] = {}
        self.stop_requested = False
        self._log_marked: dict[int, int] = {}  # rank -> the log size last stamped
        self.stopping_since: float | None = None
        self.reason = ""
        self.grown: set[str] = set()  # grow files already acted on (a launch removes an earlier run's)
        # warm spares (runtime/spare.py): number -> (process, our end of its stdin socket)
        self.spares: dict[int, tuple[subprocess.Popen, socket.socket]] = {}
        self.spares_wanted = 0
        self._spares_seen: int | None = None  # when the spare count last changed, as last read
        self._said_parked: set[int] = set()
        self._next_spare = 0
        self._handed: dict[int, socket.socket] = {}  # rank -> socket of a spare handed its place before it parked
        self.network: JobNetwork | None = None  # the job's own network namespace (--network isolated|none)
        self.quieted: set[int] = set()  # ranks told OMP_WAIT_POLICY=PASSIVE here (affinity.quiet_threads)

    def _mark_logs(self) -> None:
        """Stamp each rank's log size with the time, when it grew: 'deeppod logs' interleaves the
        ranks' lines by when they were written (to within LOG_MARK_S) from these."""
        for rank in self.procs:
            self._log_marked[rank] = self.folder.stamp_log(rank, self._log_marked.get(rank, 0))

    def _on_sigterm(self, _sig, _frame) -> None:
        self.stop_requested = True

    def start_workers(self, workers: list[dict] | None = None) -> None:
        self.folder.logs.mkdir(exist_ok=True)
        self.folder.exits.mkdir(exist_ok=True)
        for w in self.spec["workers"] if workers is None else workers:
            rank = int(w["rank"])
            log = open(self.folder.log(rank), "ab", buffering=0)
            if rank in self.quieted:
                log.write(f"deeppod: rank {rank}'s math threads sleep when idle (OMP_WAIT_POLICY=PASSIVE): the "
                          f"threads on this node may outnumber its {len(os.sched_getaffinity(0))} cores\n".encode())
            try:
                if self._hand_to_spare(rank, w["env"], log):
                    continue
                self.procs[rank] = self._popen(str(rank), w["env"], log, subprocess.DEVNULL)
            except OSError as exc:
                log.write(f"deeppod: cannot start worker: {exc}\n".encode())
                self.codes[rank] = 127
                self._record_exit(rank, 127)
                self._begin_stop(f"rank {rank} could not start: {exc}")
            finally:
                log.close()
        self._write_pids()

    def _popen(self, name: str, env: dict[str, str], log, stdin) -> subprocess.Popen:
        """One process of the job's command: ``name`` is its rank, or spare-N."""
        fds: tuple[int, ...] = ()
        worker_env = env
        if self.spec.get("sandbox"):  # it reads the command and env from spec.json itself
            argv, cwd, env = [sys.executable, "-m", "deeppod.executor.sandbox", str(self.job_dir), name], "/", None
            if self.network is not None:  # it joins the job's own network
                argv.append(str(self.network.fd))
                fds = (self.network.fd,)
        else:
            argv, cwd = self.spec["command"], self.spec["workdir"]
            if self.spec.get("env"):  # its own Python environment first (in a sandbox, the sandbox does this)
                env = envs.activate(self.spec["env"], env)
        cores = affinity.for_worker(worker_env) if name.isdigit() else None  # a spare has no GPUs yet
        if cores is not None:
            log.write(f"deeppod: rank {name} runs on cores {affinity.format_list(cores)}, near its GPUs\n".encode())
        return subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin, stdout=log, stderr=subprocess.STDOUT,
                                process_group=0, pass_fds=fds,
                                preexec_fn=affinity.pinning(cores, die_with_parent if self.part is not None else None))

    def _prepare_env(self) -> None:
        """The job's own Python environment (envs/): built here, or found built, before any worker
        starts; the build's output goes to the first worker's log."""
        order = self.spec.get("env")
        if not order or self.codes:
            return
        first = min(int(w["rank"]) for w in self.spec["workers"])
        self.folder.logs.mkdir(exist_ok=True)
        self.folder.write_phase("preparing environment")
        try:
            with open(self.folder.log(first), "ab", buffering=0) as log:
                if order.get("image"):
                    images.ensure(order, log)
                else:
                    envs.ensure(order, log, self.spec.get("sandbox"))
        except (envs.BuildError, OSError) as exc:
            self.codes = {int(w["rank"]): 1 for w in self.spec["workers"]}
            self.reason = (f"could not unpack its image: {exc}" if order.get("image")
                           else f"could not build its Python environment: {exc}")
        finally:
            self.folder.write_phase(None)

    def _mount_shm(self) -> None:
        """A sandboxed job's /dev/shm here: a tmpfs of its own, as large as its workers here may
        use of memory together (executor/job_shm.py)."""
        sb = self.spec.get("sandbox") or {}
        if not sb.get("shm"):
            return
        memory = (sb.get("limits") or {}).get("memory_mb")
        try:
            job_shm.mount_shm(sb["shm"], int(sb["uid"]), int(sb["gid"]),
                              int(memory) * len(self.spec["workers"]) if memory else None)
        except OSError as exc:
            if self.procs:  # a grow: the workers running keep the size they have
                log_line = f"could not resize the job's /dev/shm: {exc}"
                print(f"deeppod supervisor: {log_line}", file=sys.stderr, flush=True)
                return
            self.codes = {int(w["rank"]): 126 for w in self.spec["workers"]}  # never the host's /dev/shm instead
            self.reason = f"could not make the job's own /dev/shm: {exc}"

    def _start_network(self) -> None:
        """``--network isolated|none``: the job's own network namespace on this node (executor/netns.py)."""
        net = (self.spec.get("sandbox") or {}).get("network")
        if not net or net.get("mode", "host") == "host":
            return
        try:
            self.network = JobNetwork.start([Forward(int(f[0]), str(f[1]), int(f[2])) for f in net.get("forward", [])])
        except OSError as exc:  # no worker may start on the host's network instead
            self.codes = {int(w["rank"]): 126 for w in self.spec["workers"]}
            self.reason = f"could not make the job's own network: {exc}"

    def _write_pids(self) -> None:
        pids = {str(r): p.pid for r, p in self.procs.items()}
        pids.update({f"spare-{n}": p.pid for n, (p, _) in self.spares.items()})  # a vanished supervisor's strays
        self.folder.write_pids(pids, self.part)

    # warm spares ---------------------------------------------------------------------
    def _check_spares(self) -> None:
        """How many spares the control plane wants (the job folder says); keep that many parked."""
        seen = self.folder.spares_changed_at()
        if seen is not None and seen != self._spares_seen:
            self._spares_seen = seen
            self.spares_wanted = self.folder.read_spares()
        self._keep_spares(self.spares_wanted)

    def _keep_spares(self, wanted: int) -> None:
        changed = False
        for n, (p, sock) in list(self.spares.items()):
            if p.poll() is not None:  # it died parked (its imports failed?): a grow starts a worker cold
                del self.spares[n]
                sock.close()
                _signal_group(p.pid, signal.SIGKILL)
                wanted = min(wanted, len(self.spares))  # not again and again: the next file says when
                self.spares_wanted = wanted
                changed = True
        while len(self.spares) > wanted:
            _, (p, sock) = self.spares.popitem()
            sock.close()  # on EOF it tidies up and exits at once; the kill is for one that does not
            try:
                p.wait(SPARE_EXIT_S)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p.pid, signal.SIGKILL)
            changed = True
        while len(self.spares) < wanted and self.spec["workers"]:
            n, self._next_spare = self._next_spare, self._next_spare + 1
            env = spare_env(self.spec["workers"][0]["env"], n)
            if self.spec.get("sandbox"):
                self.spec.setdefault("spares", {})[str(n)] = env
                self._save_spec()
            ours, theirs = socket.socketpair()
            log = open(self.folder.spare_log(n), "ab", buffering=0)
            try:
                self.spares[n] = (self._popen(f"spare-{n}", env, log, theirs), ours)
            except OSError as exc:
                log.write(f"deeppod: cannot start spare {n}: {exc}\n".encode())
                ours.close()
                self.spares_wanted = wanted = len(self.spares)
            finally:
                theirs.close()
                log.close()
            changed = True
        if changed:
            self._write_pids()

    def _parked(self, n: int) -> bool:
        """Whether spare N said it waits in runtime.init() (runtime/spare.py), its imports done."""
        if n not in self._said_parked and (_heard(self.spares[n][1]) or b"").startswith(b"parked"):
            self._said_parked.add(n)
        return n in self._said_parked

    def _hand_to_spare(self, rank: int, env: dict[str, str], log) -> bool:
        """Give a spare the place of new worker ``rank``: its env and log file. A parked spare
        first; else one still importing, which reads its place as soon as it parks: it is
        further along than a new process would be, and a new one would only slow it down
        (a grow right after a shrink, while the spares start: 2 cold joiners beside 2 spares
        took 18 s to be ready on 2 cores, and the spares were then thrown away)."""
        if self.spec.get("sandbox") and not spare_may_become(env, os.listdir("/dev")):
            return False  # a spare holds no GPU device (executor/sandbox.py): this worker starts as itself
        for n in sorted(self.spares, key=lambda n: (not self._parked(n), n)):
            parked = self._parked(n)
            p, sock = self.spares.pop(n)
            try:
                if p.poll() is not None:
                    raise OSError("it exited")
                how = "warm spare" if parked else "spare still starting"
                log.write(f"deeppod: rank {rank} starts from {how} {n} (pid {p.pid})\n".encode())
                cores = affinity.for_worker(env)  # a spare had no GPUs: now it has this place's
                if cores is not None and affinity.pin_tree(p.pid, cores):
                    log.write(f"deeppod: rank {rank} runs on cores {affinity.format_list(cores)}, near its GPUs\n"
                              .encode())
                socket.send_fds(sock, [json.dumps(env).encode() + b"\n"], [log.fileno()])
            except OSError:
                sock.close()
                _signal_group(p.pid, signal.SIGKILL)
                continue
            if parked:
                sock.close()
            else:  # closed once it has parked and read its place: closed before, it would just exit
                self._handed[rank] = sock
            self.procs[rank] = p
            self.spares_wanted = max(0, self.spares_wanted - 1)  # another when the control plane says
            return True
        return False

    def _release_handed(self, everything: bool = False) -> None:
        """Close our end of a handed spare's socket once it has said "parked" (it read its
        place right after), hung up, or exited."""
        for rank, sock in list(self._handed.items()):
            if everything or self.procs[rank].poll() is not None or _heard(sock) is not None:
                sock.close()
                del self._handed[rank]

    def _record_exit(self, rank: int, code: int) -> None:
        self.folder.record_exit(rank, code)

    def _begin_stop(self, reason: str) -> None:
        if self.stopping_since is not None:
            return
        self.stopping_since = time.monotonic()
        self.reason = self.reason or reason
        for rank, p in self.procs.items():
            if rank not in self.codes:
                # Not the group: a SIGTERM that reached the loader workers first would kill the
                # step the training process is finishing (torch raises "DataLoader worker killed").
                _signal_process(p.pid, signal.SIGTERM)
        self.spares_wanted = 0
        self._keep_spares(0)  # nothing of the job's ran in them: they just go

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, self._on_sigterm)
        # Lets a restarted server find us even if it died before recording our pid.
        with open("/proc/self/stat") as f:
            start_time = int(f.read().rsplit(")", 1)[1].split()[19])
        if self.part is None:  # on a cluster the node agents find their supervisors
            self.folder.write_supervisor(os.getpid(), start_time)
        self._start_network()
        self._mount_shm()
        self._prepare_env()
        self.quieted.update(affinity.quiet_threads(self.spec["workers"]))
        if self.quieted and self.spec.get("sandbox"):
            self._save_spec()
        if not self.codes:
            self.start_workers()
        grace = float(self.spec.get("grace_seconds", 30.0))
        # the kernel enforces a sandboxed worker's memory (executor/cgroups.py); else this poll
        enforced = (self.spec.get("sandbox") or {}).get("limits") is not None
        limit_mb = None if enforced else self.spec.get("memory_mb_per_worker")
        next_mem_check = next_stop_check = next_grow_check = next_mark = 0.0
        while len(self.codes) < len(self.spec["workers"]):
            for rank, p in self.procs.items():
                if rank in self.codes:
                    continue
                code = p.poll()
                if code is None:
                    continue
                self.codes[rank] = code
                self._record_exit(rank, code)
                # The worker is gone; anything it left in its group goes too.
                _signal_group(p.pid, signal.SIGKILL)
                if code != 0:
                    oom = self.folder.oom_limit(rank)
                    self._begin_stop(f"rank {rank} ran out of memory (limit {oom} MiB)" if oom else
                                     f"rank {rank} {describe_exit(code)}")
            now = time.monotonic()
            if self.part is not None and now >= next_stop_check and self.stopping_since is None:
                next_stop_check = now + STOP_FILE_CHECK_S
                self._check_stop_file()
            if self.part is None and self.stopping_since is None and now >= next_grow_check:
                next_grow_check = now + GROW_CHECK_S
                self._check_grow()
                self._check_spares()
            if self._handed:
                self._release_handed()
            if self.stop_requested:
                self._begin_stop("stop requested")
            if limit_mb and now >= next_mem_check:
                next_mem_check = now + MEMORY_CHECK_S
                for rank, p in self.procs.items():
                    if rank not in self.codes and _group_rss_mb(p.pid) > limit_mb:
                        self.reason = self.reason or f"rank {rank} exceeded its memory request of {limit_mb} MiB"
                        _signal_group(p.pid, signal.SIGKILL)
                        self._begin_stop(self.reason)
                for n, (p, _) in list(self.spares.items()):
                    if _group_rss_mb(p.pid) > limit_mb:  # it goes; the job is not at fault for it
                        _signal_group(p.pid, signal.SIGKILL)
            if now >= next_mark:
                next_mark = now + LOG_MARK_S
                self._mark_logs()
            if self.stopping_since is not None and now - self.stopping_since > grace:
                for rank, p in self.procs.items():
                    if rank not in self.codes:
                        _signal_group(p.pid, signal.SIGKILL)
            time.sleep(POLL_S)
        self._mark_logs()
        self._keep_spares(0)
        self._release_handed(everything=True)
        if self.network is not None:
            self.network.stop()
        if (self.spec.get("sandbox") or {}).get("shm"):  # every worker and spare here has ended
            job_shm.unmount_shm(self.spec["sandbox"]["shm"])  # its pages go with it
        self.folder.write_result({
            "exit_codes": {str(r): c for r, c in sorted(self.codes.items())},
            "reason": self.reason,
            "stopped": self.stop_requested,
            "ended_at": time.time(),
        }, self.part)
        return 0

    def _check_grow(self) -> None:
        """An in-place grow: the control plane left ``grow-N.json`` with the new workers. A rank
        that left in an earlier shrink may come back: its old exit is forgotten."""
        for path in self.folder.grows():
            if path.name in self.grown:
                continue
            self.grown.add(path.name)
            try:
                workers = self.folder.read_grow(path)
            except (OSError, ValueError, KeyError) as exc:
                self.reason = self.reason or f"unreadable {path.name}: {exc}"
                continue
            ranks = {int(w["rank"]) for w in workers}
            for rank in ranks:
                self.codes.pop(rank, None)
                self.procs.pop(rank, None)
            self.spec["workers"] = [w for w in self.spec["workers"] if int(w["rank"]) not in ranks] + workers
            self.quieted.update(affinity.quiet_threads(self.spec["workers"]))  # the joiners' threads with those running
            self._save_spec()
            self._mount_shm()  # sized for the workers it has now
            self.start_workers(workers)

    def _save_spec(self) -> None:
        self.folder.write_spec(self.spec)  # the sandbox reads its rank's env there

    def _check_stop_file(self) -> None:
        said = self.folder.read_stop()
        if said is None:
            return
        if said == "stop":
            self.stop_requested = True
        else:
            self._begin_stop(said or "stopped by the control plane")


def main(argv: list[str]) -> int:
    """``JOB_DIR`` alone: every worker, here. On a cluster node: ``JOB_DIR RANKS PART``
    (comma-separated ranks; which part of the job they are)."""
    if len(argv) == 2:
        return Supervisor(Path(argv[1])).run()
    if len(argv) == 4:
        return Supervisor(Path(argv[1]), {int(r) for r in argv[2].split(",")}, int(argv[3])).run()
    print("usage: python -m deeppod.executor.supervisor JOB_DIR [RANKS PART]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Slurm executor: a DeepPod job is one Slurm job (``deeppod server --executor slurm``).

``launch`` submits it with ``sbatch`` as the job's identity (its tenant's OS user), asking for
what the job asked: one task per worker, its CPUs, its memory, its GPUs as GRES
(``--gpus-per-task``, so Slurm binds each worker its own); Slurm queues it, places it and
enforces it with its cgroups. The batch step (executor/slurm_job.py) starts the workers with
one ``srun`` (executor/slurm_task.py), which gives each the job contract; results, exit codes
and logs come back through the job folder on the shared file system, as on Ray.

Slurm's word is read with ``scontrol`` and ``sinfo``: a job it holds back waits with Slurm's
reason; one it ended itself (its time, a preemption, a node that went down) finishes with it.
What needs DeepPod to move a running job's workers (in-place resize, warm spares) is refused.

The files a job's tasks write (its logs, exit codes, result) are made here first, in folders
that stay the server's, and handed to the job's identity: it can write what they hold, never
put a link where the server reads.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from deeppod.atomic import atomic_json
from deeppod.cluster.gpus import GpuInfo
from deeppod.cluster.inventory import NodeInfo
from deeppod.contract import ENV_CA_CERT, free_port
from deeppod.errors import ExecutorError
from deeppod.executor.base import ExecStatus, LaunchSpec, WorkerSpec
from deeppod.executor.local import launched, process_start_time, start_detached, write_spec
from deeppod.job_folder import JobFolder
from deeppod.nofollow import read_small
from deeppod.posix_acl import AclUnsupported, grant_read

log = logging.getLogger(__name__)

RUNNING = {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING"}
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
# how long before a time limit (the job's grace added) Slurm tells the batch step: it passes the
# word on to the workers with scancel (Slurm itself may send it up to a minute earlier)
TIME_LIMIT_LEAD_S = 10
UP = {"IDLE", "MIXED", "ALLOCATED", "COMPLETING", "PLANNED"}
# Slurm's waiting reasons (squeue(1)) in DeepPod's words
REASONS = {
    "Priority": "other jobs of a higher priority are ahead of it",
    "Resources": "the nodes it needs are busy",
    "Dependency": "it waits for the jobs it depends on",
    "BeginTime": "its start time has not come",
    "JobHeldUser": "it is held by its user",
    "JobHeldAdmin": "it is held by an administrator",
    "launch_failed_requeued_held": "Slurm could not start it on its node and holds it until an administrator "
                                   "releases it (scontrol release)",
    "PartitionDown": "its partition is down",
    "ReqNodeNotAvail": "the nodes it needs are not available",
    "QOSMaxGRESPerUser": "its user holds the most GPUs its QOS allows",
    "AssocGrpGRES": "its account holds the most GPUs its limits allow",
    "AssocMaxJobsLimit": "its account runs the most jobs its limits allow",
    "None": "Slurm has not looked at it yet",
}


class SlurmCommands(Protocol):
    def run(self, args: list[str], *, check: bool = True) -> str:
        """A Slurm command's output; ExecutorError (with what it said) when ``check`` and it fails."""


@dataclass
class SlurmCli:
    """Slurm's own commands, against ``conf`` (SLURM_CONF; None: the host's)."""

    conf: str | None = None
    timeout_s: float = 30.0

    def env(self) -> dict[str, str]:
        return {**os.environ, **({"SLURM_CONF": self.conf} if self.conf else {})}

    def run(self, args: list[str], *, check: bool = True) -> str:
        try:
            done = subprocess.run(args, capture_output=True, text=True, env=self.env(), timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExecutorError(f"{args[0]} did not answer: {exc}") from exc
        if check and done.returncode != 0:
            raise ExecutorError(f"{' '.join(args[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout


def job_name(job_id: int, instance: str) -> str:
    """A Slurm job name no other installation's jobs have (two servers may share a cluster)."""
    return f"deeppod-{instance}-{job_id}"


def fields(line: str) -> dict[str, str]:
    """``scontrol show ... -o``'s KEY=VALUE line as a mapping (values may hold spaces: Reason's)."""
    return dict(re.findall(r"(\w+)=(.*?)(?=\s\w+=|$)", line.strip()))


def waiting_reason(reason: str) -> str:
    return f"waiting in Slurm's queue: {REASONS.get(reason, reason)} ({reason})"


def gpus_of(gres: str) -> int:
    """GPUs in a node's GRES ("gpu:4", "gpu:a100:8(S:0-1)", "gpu:2,shard:4")."""
    total = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            total += int(m.group(1))
    return total


def node_reason(state: str, reason: str) -> str:
    """Why a node is out of service as Slurm says it: its state ("down*": the * says slurmctld hears
    nothing from it) and the Reason an administrator or slurmctld gave ("none": none given)."""
    said = reason if reason and reason.lower() not in ("none", "(null)") else ""
    return f"{state.lower()} in Slurm" + (f": {said}" if said else "")


def hostnames(expression: str) -> list[str]:
    """A Slurm host list as its names: "n[1-3,07],gpu-a" -> n1 n2 n3 n07 gpu-a (zero padding kept)."""
    names = []
    for prefix, ranges, plain in re.findall(r"([^,\[]*)\[([^\]]*)\]|([^,\[\]]+)", expression):
        if plain:
            names.append(plain.strip())
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low) if low.startswith("0") else 0
            names += [f"{prefix}{n:0{width}d}" for n in range(int(low), int(high or low) + 1)]
    return [n for n in names if n and n != "(null)"]


def placed(folder: JobFolder, nodes: set[str]) -> tuple[tuple[int, str, tuple[int, ...]], ...]:
    """Where each task says Slurm put it, kept only where Slurm says the job runs (a task is the
    job's: its word is checked, read with no link followed, and bounded)."""
    out = []
    try:  # the folder is the server's: the job writes the files in it, never adds one
        ranks = sorted(int(n[5:]) for n in os.listdir(folder.exits) if n.startswith("node-") and n[5:].isdigit())
    except OSError:
        return ()
    for rank in ranks:
        raw = read_small(folder.node_file(rank), 4096)
        if raw is None:
            continue
        try:
            d = json.loads(raw or b"null")
            node, gpus = str(d["node"]), tuple(int(g) for g in str(d["gpus"]).split(",") if g.strip())
        except (ValueError, TypeError, KeyError):
            continue
        if node in nodes and all(0 <= g < 4096 for g in gpus):
            out.append((rank, node, gpus))
    return tuple(out)


def refuse_unsupported(spec: LaunchSpec) -> None:
    """What a job on Slurm cannot have yet (its tasks run as its identity, with no sandbox of
    DeepPod's around them), refused before anything is submitted."""
    sandbox = spec.sandbox or {}
    if (sandbox.get("network") or {}).get("mode") not in (None, "host"):
        raise ExecutorError("a network of the job's own (--network isolated or none) is not made on Slurm: submit the "
                            "job with --network host")


def site_python(spec: LaunchSpec, python: str, pythonpath: str) -> LaunchSpec:
    """A job the platform made (a serving replica, an evaluation, the built-in trainer) runs the
    server's interpreter; on Slurm it runs the one the site installed for its nodes instead, and
    imports deeppod from where the site put it (a PYTHONPATH of the job's own comes first)."""
    if not spec.command or spec.command[0] != sys.executable:
        return spec
    workers = [replace(w, env={"PYTHONPATH": pythonpath, **w.env}) for w in spec.workers] if pythonpath \
        else spec.workers
    return replace(spec, command=[python, *spec.command[1:]], workers=workers)


def readable(spec: LaunchSpec) -> list[str]:
    """What the job may read besides its own folder (its datasets, what the platform hands a job it
    made): a sandbox binds these read-only; on Slurm its identity is let read them where they are."""
    ca = spec.workers[0].env.get(ENV_CA_CERT) if spec.workers else None
    own = (str(spec.job_dir) + "/", *((os.path.dirname(ca) + "/",) if ca else ()))
    return [src for src, _dst, writable in (spec.sandbox or {}).get("binds", [])
            if not writable and not (src + "/").startswith(own)]


def let_read(spec: LaunchSpec) -> None:
    """The job's identity may read its datasets (and list and cross their folders) through an ACL
    entry of its own: other identities may not, and the server's files around them stay its own."""
    uid = (spec.sandbox or {}).get("uid")
    for path in readable(spec) if uid is not None else []:
        try:
            grant_read(path, uid)
        except AclUnsupported:
            raise ExecutorError(f"a job's datasets on Slurm are shared with its identity by POSIX ACLs, which the "
                                f"file system of {path} does not keep: mount it with ACLs (acl), or submit the job "
                                "without --dataset and read the data from the shared file system in the script") \
                from None


class SlurmExecutor:
    in_place = False
    cluster = True
    queues = True  # Slurm decides when and where: DeepPod hands it every job its plan allows
    names_kept = True  # Slurm's nodes are its configuration's: one resumed is the same node

    def __init__(self, cli: SlurmCommands | None = None, *, instance: str = "local", partition: str | None = None,
                 python: str | None = None, pythonpath: str | None = None):
        """``python`` and ``pythonpath``: the interpreter the batch step and the tasks run and where they
        import deeppod from, both where the jobs' identities may read them (a site installs DeepPod on
        its shared file system); by default the server's own."""
        self.cli = cli or SlurmCli()
        self._children: dict[int, subprocess.Popen] = {}  # preparations started here, reaped when they end
        self.python = python or sys.executable
        self.instance = instance
        self.partition = partition
        # the batch step imports deeppod as the server does (the install is on the shared file system)
        self.pythonpath = pythonpath if pythonpath is not None else os.pathsep.join(p for p in sys.path if p)

    # -- a job -------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> dict:
        refuse_unsupported(spec)
        let_read(spec)
        spec = site_python(spec, self.python, self.pythonpath)
        if spec.env:  # built by the server's host, on the shared file system, for the Python the tasks run
            spec = replace(spec, env={**spec.env, "base_python": self.python,
                                      "layer": [p for p in self.pythonpath.split(os.pathsep) if p]})
        who = spec.sandbox or {}
        uid, gid = who.get("uid"), who.get("gid")
        write_spec(spec)
        folder = JobFolder(spec.job_dir)
        folder.exits.mkdir(exist_ok=True)
        for path in (folder.root, folder.logs):  # the job's identity crosses them to its files
            os.chmod(path, 0o711)
        os.chmod(folder.exits, 0o755)  # and lists the exit codes of its ranks (names only: each file is 0600)
        own = [folder.result_file(), folder.slurm_batch("log"), folder.slurm_spec()]
        for w in spec.workers:
            own += [folder.log(w.rank), folder.marks(w.rank), folder.exit_file(w.rank), folder.node_file(w.rank)]
        tasks = json.dumps({"command": spec.command, "workdir": spec.workdir, "grace_seconds": spec.grace_seconds,
                            "gpus_per_worker": spec.gpus_per_worker, "workers": [w.to_json() for w in spec.workers],
                            "env": spec.env, "binds": (spec.sandbox or {}).get("binds", [])})
        kept = {folder.log(w.rank) for w in spec.workers} | {folder.marks(w.rank) for w in spec.workers}
        for path in own:  # the job's to write, in folders that stay the server's; no link followed
            # its logs go on from its earlier runs; what a run ends with starts empty
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (0 if path in kept else os.O_TRUNC), 0o600)
            try:
                if path == folder.slurm_spec():
                    os.write(fd, tasks.encode())
                if uid is not None:
                    os.fchown(fd, uid, gid)
            finally:
                os.close(fd)
        script = folder.slurm_batch("sh")
        script.write_text(f"#!/bin/sh\nexec {self.python} -m deeppod.executor.slurm_job {folder.root}\n")
        args = ["sbatch", "--parsable", f"--job-name={job_name(spec.job_id, self.instance)}",
                f"--comment={spec.run or '-'}", f"--chdir={spec.workdir}", f"--output={folder.slurm_batch('log')}",
                *self.resources(spec), "--requeue", "--export=" + ",".join(self._exported()), str(script)]
        if uid is not None:
            args[1:1] = [f"--uid={uid}", f"--gid={gid}"]
        if self.partition:
            args.insert(1, f"--partition={self.partition}")
        args[1:1] = [f"--{key}={value}" for key, value in (("account", spec.account), ("qos", spec.qos)) if value]
        if spec.env:
            return self._prepare(spec, folder, args)
        slurm_id = self.cli.run(args).strip().split(";")[0]
        log.info("job %s: Slurm job %s submitted", spec.job_id, slurm_id)
        return {"kind": "slurm", "job_dir": str(spec.job_dir), "slurm_id": slurm_id}

    def _prepare(self, spec: LaunchSpec, folder: JobFolder, args: list[str]) -> dict:
        """Its environment first: a process of the server's builds it (minutes, the first time) and
        then submits ``args`` (executor/slurm_prepare.py); the handle has no Slurm id until then."""
        conf = getattr(self.cli, "conf", None)
        atomic_json(folder.slurm_submit(), {"argv": args, "env": {"SLURM_CONF": conf} if conf else {}})
        proc, start = start_detached("deeppod.executor.slurm_prepare", folder, "the job's preparation")
        self._children[proc.pid] = proc
        folder.write_supervisor(proc.pid, start or 0)
        log.info("job %s: its environment is prepared (pid %s), then it goes to Slurm", spec.job_id, proc.pid)
        return {"kind": "slurm", "job_dir": str(spec.job_dir), "slurm_id": None, "pid": proc.pid,
                "start_time": start}

    def _preparing(self, handle: dict) -> bool:
        """Whether the job's preparation (its environment's build, then its submit) still runs."""
        pid = handle.get("pid") or 0
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:  # ours, and ended: reaped
            del self._children[pid]
            return False
        return bool(pid) and process_start_time(pid) == handle.get("start_time")

    def _slurm_id(self, handle: dict) -> str | None:
        return handle.get("slurm_id") or JobFolder(Path(handle["job_dir"])).read_slurm_id()

    def resources(self, spec: LaunchSpec) -> list[str]:
        """One task per worker, with the worker's CPUs, memory and GPUs; the job's time limit (Slurm's
        are whole minutes) and, ahead of whichever limit ends it, a word to the batch step, which
        stops the workers as a stop would: they have their grace to checkpoint before Slurm's end."""
        cpus = max(1, math.ceil(spec.cpus_per_worker))
        args = [f"--ntasks={len(spec.workers)}", f"--cpus-per-task={cpus}",
                f"--signal=B:USR1@{math.ceil(spec.grace_seconds) + TIME_LIMIT_LEAD_S}"]
        if spec.time_limit_seconds:
            args.append(f"--time={max(1, math.ceil(spec.time_limit_seconds / 60))}")
        if spec.memory_mb_per_worker:
            args.append(f"--mem-per-cpu={math.ceil(spec.memory_mb_per_worker / cpus)}M")
        if spec.gpus_per_worker:
            args.append(f"--gpus-per-task={spec.gpus_per_worker}")
        return args

    def _exported(self) -> list[str]:
        """What the batch step inherits from the server: where deeppod and Slurm are, nothing else."""
        env = {"PYTHONPATH": self.pythonpath, "PATH": os.environ.get("PATH", os.defpath)}
        conf = getattr(self.cli, "conf", None)
        if conf:
            env["SLURM_CONF"] = conf
        if any("," in v for v in env.values()):
            raise ExecutorError("a path with a comma cannot be passed to Slurm's --export: install DeepPod where "
                                "its path has none")
        return [f"{k}={v}" for k, v in env.items()]

    def find(self, job_id: int, job_dir: Path, run: str) -> dict | None:
        out = self.cli.run(["squeue", "-h", "--states=all", f"--name={job_name(job_id, self.instance)}",
                            "-o", "%i|%k"], check=False)
        for line in out.splitlines():
            slurm_id, _, comment = line.partition("|")
            if comment.strip() == (run or "-"):
                return {"kind": "slurm", "job_dir": str(job_dir), "slurm_id": slurm_id.strip()}
        folder = JobFolder(job_dir)
        if launched(job_dir, run) and (prep := folder.read_supervisor()):  # its environment was being prepared
            handle = {"kind": "slurm", "job_dir": str(job_dir), "slurm_id": None, **prep}
            if self._preparing(handle) or folder.read_result() is not None or folder.read_slurm_id():
                return handle
        return None

    def poll(self, handle: dict) -> ExecStatus:
        folder = JobFolder(Path(handle["job_dir"]))
        preparing = self._preparing(handle)  # and reaped once it has ended
        if (result := folder.read_result()) is not None:
            return ExecStatus(finished=True, exit_codes={int(k): int(v) for k, v in result["exit_codes"].items()},
                              reason=result.get("reason", ""), stopped=bool(result.get("stopped")),
                              timed_out=bool(result.get("timed_out")))
        if (slurm_id := self._slurm_id(handle)) is None:
            if preparing:
                return ExecStatus(finished=False, phase=folder.read_phase() or "preparing environment")
            if folder.read_result() is not None or folder.read_slurm_id():  # it ended, or submitted, meanwhile
                return self.poll(handle)
            return ExecStatus(finished=True, lost=True, reason="the job's preparation ended before it was submitted "
                                                              "(the server's log says why)")
        job = self._show(slurm_id)
        state = (job.get("JobState") or "GONE").split()[0]
        if state in WAITING:
            again = " (requeued by Slurm)" if int(job.get("Restarts", "0") or 0) else ""
            return ExecStatus(finished=False, phase=waiting_reason(job.get("Reason", "None")) + again)
        if state in RUNNING:
            return ExecStatus(finished=False, exit_codes=folder.exit_codes(),
                              placed=placed(folder, set(hostnames(job.get("NodeList", "")))))
        if (result := folder.read_result()) is not None:  # it finished between the two looks
            return self.poll(handle)
        stopped = folder.read_stop() == "stop"
        lost = (job.get("NodeList", "").split(",") if state == "NODE_FAIL" else [])
        timed_out = state == "TIMEOUT"  # its workers did not end in their grace after the batch step's word
        return ExecStatus(finished=True, exit_codes=folder.exit_codes(), stopped=stopped, timed_out=timed_out,
                          reason="" if stopped or timed_out else f"Slurm ended the job: {state} "
                                                                 f"({job.get('Reason', 'None')})",
                          lost=state == "GONE", lost_nodes=tuple(n for n in lost if n))

    def _show(self, slurm_id: str) -> dict[str, str]:
        out = self.cli.run(["scontrol", "show", "job", slurm_id, "-o"], check=False)
        return fields(out.splitlines()[0]) if out.strip() else {}

    def terminate(self, handle: dict) -> None:
        folder = JobFolder(Path(handle["job_dir"]))
        if folder.read_stop() is None:
            folder.ask_stop("stop")  # before the id is read: a preparation that submits after this cancels
        if (slurm_id := self._slurm_id(handle)) is None:
            return  # its preparation reads the word: nothing is submitted once its build is done
        state = (self._show(slurm_id).get("JobState") or "").split(" ")[0]
        if state in WAITING:
            self.cli.run(["scancel", slurm_id], check=False)
        elif state in RUNNING:
            # the workers' tasks; each gives its worker the job's grace, then kills what is left
            self.cli.run(["scancel", "--signal=TERM", slurm_id], check=False)

    def port_on(self, node: str, address: str) -> int:
        return free_port()  # unused: the batch step picks the rendezvous where Slurm put rank 0

    def add_workers(self, handle: dict, workers: list[WorkerSpec], generation: int) -> None:
        raise ExecutorError("a job on Slurm cannot grow in place: Slurm allocates a job's nodes once")

    def keep_spares(self, handle: dict, count: int) -> None:
        raise ExecutorError("warm spares are not kept on Slurm")

    def usage(self, handle: dict) -> None:
        return None  # the workers run on Slurm's nodes (sstat knows them, where accounting runs)

    # -- the cluster -------------------------------------------------------------------
    def nodes(self) -> list[NodeInfo]:
        """Slurm's nodes (of the configured partition), with their CPUs, memory and GPUs (GRES);
        one that is not in service says why in Slurm's words (its state and the Reason given)."""
        args = ["sinfo", "-h", "-N", "-o", "%N|%o|%c|%m|%G|%T|%E"] + ([f"--partition={self.partition}"]
                                                                        if self.partition else [])
        out, seen = [], set()
        for line in self.cli.run(args).splitlines():
            name, addr, cpus, mem, gres, state, why = (p.strip() for p in line.split("|", 6))  # a Reason may hold |
            if name in seen:  # a node of several partitions
                continue
            seen.add(name)
            gpus = tuple(GpuInfo(i, f"slurm-{name}-{i}", "GPU", 0, True) for i in range(gpus_of(gres)))
            healthy = state.rstrip("*~#!%$@^-").upper() in UP
            out.append(NodeInfo(name=name, address=addr, cpus=int(cpus), memory_mb=int(mem), gpus=gpus,
                                healthy=healthy, reason="" if healthy else node_reason(state, why)))
        return out

    def samplers(self):
        return None  # no sampler of DeepPod's runs on Slurm's nodes

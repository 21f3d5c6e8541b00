"""Ray executor: DeepPod's scheduler decides, Ray carries out (``deeppod server --executor ray``).

Ray's nodes are DeepPod's nodes (:meth:`RayExecutor.nodes`). For each node a job was placed
on, a small detached actor, the *node agent*, is started on exactly that node (node
affinity, not soft). It checks that the job's folder is visible there (shared storage) and
runs the same per-job supervisor as the local executor, for that node's ranks only, as a
subprocess with the same job contract. Exit codes, logs and results go to the job's folder
on the shared file system, so following a job is the same whichever node runs it.

The agent's supervisor and its workers die with the agent (parent-death signal), as they
would with the machine: a node that leaves takes its part of the job with it, the other
nodes' supervisors are told to stop (``JOB_DIR/stop``), and the job is requeued with the
same id to resume from its last checkpoint. Agents are detached and named after the job and
node, so a restarted server finds them again.

Ray is the transport, never a second scheduler: agents ask Ray for no CPUs or GPUs; the
GPUs a worker gets are the ones DeepPod decided (CUDA_VISIBLE_DEVICES in its contract).
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
from pathlib import Path

from deeppod.cluster.gpus import GpuInfo
from deeppod.cluster.inventory import NodeInfo
from deeppod.contract import free_port
from deeppod.errors import ExecutorError, NodeLost
from deeppod.executor.base import ExecStatus, LaunchSpec
from deeppod.executor.local import launched, write_spec
from deeppod.job_folder import JobFolder
from deeppod.scheduler.burst_types import RESOURCE_PREFIX, type_of_resources

log = logging.getLogger(__name__)

MIN_RAY = (2, 55)
NAMESPACE = "deeppod"
START_TIMEOUT_S = 120.0  # an agent's start on a node (a cold node starts a Ray worker process first)
ALIVE_TIMEOUT_S = 10.0
BURST_HOLD = 0.001  # of a burst node's deeppod-burst-TYPE resource, held by each agent there
SAMPLE_TIMEOUT_S = 5.0  # a node whose sampler does not answer in time is left out of that round


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def _host_port(address: str) -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT -> (host, port); ValueError if it is neither."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _answers(address: str, timeout: float = 5.0) -> bool:
    try:
        with socket.create_connection(_host_port(address), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def _token_auth() -> bool:
    """Whether this driver connects with Ray's token authentication (RAY_AUTH_MODE=token, Ray's
    own setting): a cluster started with it refuses a driver without the token, one started
    without it never asks for it."""
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode

        return get_authentication_mode() == AuthenticationMode.TOKEN
    except (ImportError, AttributeError):  # a Ray without token authentication
        return False


def _local_ip_towards(address: str) -> str:
    host, port = _host_port(address)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))  # UDP: no packet is sent, the route is chosen
        return s.getsockname()[0]


def _agent_prefix(job_id: int) -> str:
    """Node agents are named after their job and part: found again after a server restart."""
    return f"deeppod-job-{job_id}-"


# Ray starts its workers at niceness 15 (its drivers first); a job's supervisor and workers would
# inherit it and get 1/28 of a core beside any process at the node's own priority (a 3-step DDP
# job took two minutes to import torch beside one busy loop). Ray's own job supervisor asks for 0 so.
AT_NODE_PRIORITY = {"env_vars": {"RAY_worker_niceness": "0"}}


class _Agent:
    """One node's part of one job (the class Ray runs as a detached actor on that node)."""

    def __init__(self) -> None:
        self.proc = None

    def start(self, job_dir: str, ranks: list[int], part: int, nonce: str) -> str | None:
        """Start the supervisor of ``ranks`` (part ``part`` of the job); None, or why not (the
        job folder is not shared)."""
        import subprocess
        import sys

        from deeppod.executor.supervisor import die_with_parent

        folder = JobFolder(Path(job_dir))
        if folder.read_shared_check() != nonce:
            return (f"the job folder {job_dir} is not visible on node {socket.gethostname()}: DeepPod's home "
                    "(job folders, checkpoints, datasets) must be on a file system every node shares, at the "
                    "same path (docs/cluster.md)")
        out = open(folder.supervisor_log(part), "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "deeppod.executor.supervisor", job_dir, ",".join(map(str, ranks)), str(part)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, close_fds=True,
                preexec_fn=die_with_parent)
        except OSError as exc:
            return f"could not start the job's supervisor on {socket.gethostname()}: {exc}"
        finally:
            out.close()
        return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def port(self, host: str) -> int:
        return free_port(host)


class _Sampler:
    """One node's monitoring samplers (an actor per node, owned by the server: it ends with it).
    NVML on the node's own GPUs where Ray sees real ones; the node's host through psutil."""

    def __init__(self, real_gpus: bool) -> None:
        from deeppod.cluster.readings import NoGpus, OneNode, PsutilHostSampler, default_gpu_sampler

        self.node = OneNode(socket.gethostname(), default_gpu_sampler(None) if real_gpus else NoGpus(),
                            PsutilHostSampler())

    def read(self):
        return self.node.reading()


class RayNodes:
    """The monitor's source on a Ray cluster: every live node's sampler, read in parallel."""

    def __init__(self, executor: RayExecutor):
        self.executor = executor
        self._actors: dict[str, object] = {}  # Ray node id -> its sampler

    def read(self) -> dict:
        ray, ex = self.executor.ray, self.executor
        refs = {}
        for name in ex.live_nodes():
            node_id = ex.node_id(name)
            if name in ex.let_go:
                if (gone := self._actors.pop(node_id, None)) is not None:
                    ray.kill(gone)
                continue
            actor = self._actors.get(node_id)
            if actor is None:
                actor = self._actors[node_id] = ex.start_sampler(name)
            refs[actor.read.remote()] = (name, node_id)
        done, late = ray.wait(list(refs), num_returns=len(refs), timeout=SAMPLE_TIMEOUT_S) if refs else ([], [])
        out = {}
        for ref in done:
            name, node_id = refs[ref]
            try:
                out[name] = ray.get(ref)
            except ray.exceptions.RayError as exc:  # the node left or its sampler died: a new one next round
                log.info("node %s was not sampled: %s", name, exc)
                self._actors.pop(node_id, None)
        for ref in late:
            log.info("node %s did not answer its sampler within %.0f s", refs[ref][0], SAMPLE_TIMEOUT_S)
        return out


class RayExecutor:
    in_place = False  # a resize on Ray is a checkpoint restart (workers on other nodes: not yet)
    cluster = True
    queues = False  # Ray runs what it is handed at once: DeepPod's round places jobs on its nodes
    names_kept = False  # a Ray node that comes back has a new id

    def __init__(self, address: str, gpus_per_node: int | None = None, instance: str = ""):
        """``instance``: Settings.instance; its named actors live in a namespace of its own, so
        two DeepPod installations on one Ray cluster never find each other's."""
        try:
            import ray
        except ImportError:
            raise ExecutorError("--executor ray needs Ray: pip install 'deeppod[ray]' (Ray >= 2.55)") from None
        if _version(ray.__version__) < MIN_RAY:
            raise ExecutorError(f"Ray {ray.__version__} is too old: DeepPod needs Ray >= "
                                f"{'.'.join(map(str, MIN_RAY))} (pip install -U 'ray>=2.55')")
        if not _answers(address):
            raise ExecutorError(f"no Ray cluster answers at {address}: start one with 'ray start --head' on the head "
                                "machine (docs/cluster.md), or fix --ray-address")
        self.ray = ray
        self.address = address
        # Ray's token authentication: without it anything that reaches the cluster's ports (a
        # job on the host's network included) can run code as the Ray nodes' identity
        self.authenticated = _token_auth()
        self.gpus_per_node = gpus_per_node
        # a Ray driver talks to the raylet of its own node: the one at the address this machine
        # reaches the head from (127.0.0.1 for a cluster on one machine)
        ray.init(address=address, namespace=f"{NAMESPACE}-{instance}" if instance else NAMESPACE, log_to_driver=False,
                 logging_level=logging.WARNING, _node_ip_address=_local_ip_towards(address))
        self._agent = ray.remote(num_cpus=0, max_restarts=0)(_Agent)
        self._sampler = ray.remote(num_cpus=0, max_restarts=0)(_Sampler)
        self._ids: dict[str, str] = {}  # DeepPod node name -> Ray node id
        self._asked: dict[str, tuple] = {}  # agent name -> (its pending alive() answer, when asked)
        self._real: dict[str, bool] = {}  # DeepPod node name -> Ray sees real GPUs there
        self._up: frozenset[str] = frozenset()  # nodes Ray reports alive (replaced whole: read by the monitor's thread)
        self._burst: dict[str, str] = {}  # DeepPod node name -> its burst resource (burst nodes only)
        # burst nodes DeepPod lets go: not sampled, so that Ray sees them idle (a live actor
        # keeps a node busy in the raylet's eyes) and the autoscaler can remove them
        self.let_go: frozenset[str] = frozenset()
        log.info("connected to the Ray cluster at %s (Ray %s)", address, ray.__version__)

    # nodes -------------------------------------------------------------------------------
    def nodes(self) -> list[NodeInfo]:
        """Every node Ray knows, alive or not, as DeepPod nodes. GPUs are Ray's ``GPU``
        resource, or ``gpus_per_node`` logical slots on a CPU cluster."""
        out, up = [], set()
        for n in self.ray.nodes():
            res = n.get("Resources") or {}
            # the id's end: Ray's ids are random throughout, and nodes an autoscaler's provider
            # numbers (its fake multi-node one) differ only there
            name = f"{n.get('NodeManagerHostname') or n['NodeManagerAddress']}-{n['NodeID'][-8:]}"
            self._ids[name] = n["NodeID"]
            real = int(res.get("GPU", 0))
            self._real[name] = bool(real)
            if (kind := type_of_resources(res)) is not None:
                self._burst[name] = RESOURCE_PREFIX + kind
            if n.get("Alive"):
                up.add(name)
            count = real or (self.gpus_per_node or 0)
            gpus = tuple(GpuInfo(i, f"{n['NodeID'][-12:]}-{i}", "GPU" if real else "logical", 0, not real)
                         for i in range(count))
            out.append(NodeInfo(name=name, address=n["NodeManagerAddress"], cpus=int(res.get("CPU", 0)),
                                memory_mb=int(res.get("memory", 0)) >> 20, gpus=gpus, healthy=bool(n.get("Alive")),
                                burst=type_of_resources(res)))
        self._up = frozenset(up)
        return out

    def leave_alone(self, kept: set[str]) -> None:
        """The burst nodes not in ``kept`` are let go: their samplers end (``let_go``)."""
        self.let_go = frozenset(n for n in self._burst if n not in kept)

    def _burst_hold(self, node: str) -> dict[str, float]:
        return {self._burst[node]: BURST_HOLD} if node in self._burst else {}

    def live_nodes(self) -> list[str]:
        if not self._ids:
            self.nodes()
        return sorted(self._up)

    def node_id(self, name: str) -> str:
        return self._ids[name]

    def samplers(self) -> RayNodes:
        """The monitor's source: a sampler on every live node."""
        return RayNodes(self)

    def start_sampler(self, node: str):
        return self._sampler.options(scheduling_strategy=self._strategy(node)).remote(self._real.get(node, False))

    def _strategy(self, node: str):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if node not in self._ids:
            self.nodes()
        if node not in self._ids:
            raise NodeLost([node], f"node {node} is not in the Ray cluster any more")
        return NodeAffinitySchedulingStrategy(self._ids[node], soft=False)

    def port_on(self, node: str, address: str) -> int:
        """A TCP port free on ``node`` now (rank 0's: MASTER_PORT)."""
        agent = self._agent.options(scheduling_strategy=self._strategy(node)).remote()
        try:
            return self.ray.get(agent.port.remote(address), timeout=START_TIMEOUT_S)
        except self.ray.exceptions.RayActorError as exc:
            raise NodeLost([node], f"node {node} was lost ({exc})") from None
        except self.ray.exceptions.RayError as exc:
            raise ExecutorError(f"could not reach node {node} through Ray: {exc}") from None
        finally:
            self.ray.kill(agent)

    def autoscaler(self) -> RayAutoscaler:
        """Ray's autoscaler, for bursting (cluster/burst.py)."""
        return RayAutoscaler(self)

    # jobs --------------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> dict:
        job_dir, folder = spec.job_dir, JobFolder(spec.job_dir)
        write_spec(spec)
        nonce = secrets.token_hex(8)
        folder.write_shared_check(nonce)
        by_node: dict[str, list[int]] = {}
        for w in spec.workers:
            by_node.setdefault(w.node, []).append(w.rank)
        nodes, started = {}, []
        try:
            for part, (node, ranks) in enumerate(by_node.items()):
                name = f"{_agent_prefix(spec.job_id)}{part}"
                self._kill_named(name)  # a leftover of an earlier run of this job
                # on a burst node, a sliver of its burst resource: the autoscaler sees it in use and
                # does not let it go as idle under the job
                agent = self._agent.options(name=name, lifetime="detached", scheduling_strategy=self._strategy(node),
                                            resources=self._burst_hold(node), runtime_env=AT_NODE_PRIORITY).remote()
                started.append(agent)
                try:
                    why = self.ray.get(agent.start.remote(str(job_dir), ranks, part, nonce),
                                       timeout=START_TIMEOUT_S)
                except self.ray.exceptions.RayActorError as exc:  # its node died under it
                    raise NodeLost([node], f"node {node} was lost while the job started ({exc})") from None
                if why:
                    raise ExecutorError(why)
                nodes[node] = {"agent": name, "ranks": ranks, "part": part}
        except Exception as exc:
            folder.ask_stop("the job could not start on every node")
            for agent in started:
                self.ray.kill(agent)
            if isinstance(exc, ExecutorError):
                raise
            raise ExecutorError(f"could not start the job on the Ray cluster: {exc}") from exc
        log.info("job %s: started on %s", spec.job_id, ", ".join(nodes))
        return {"kind": "ray", "job_dir": str(job_dir), "nodes": nodes}

    def find(self, job_id: int, job_dir: Path, run: str) -> dict | None:
        """A launch whose handle was never recorded: stop what it may have started."""
        if not launched(job_dir, run):
            return None
        return {"kind": "ray", "job_dir": str(job_dir), "nodes": {}, "unknown": job_id}

    def _kill_named(self, name: str) -> None:
        try:
            self.ray.kill(self.ray.get_actor(name))
        except ValueError:  # no such actor
            pass

    def _alive(self, name: str) -> bool:
        """Whether a node agent lives, without waiting on Ray: polls run inside the leader's
        round, and a wait there (an agent on a node that just died answers nothing for many
        seconds) held the round past the leader's lease. The question is sent once; its answer
        is read, ready, on a later poll."""
        asked = self._asked.get(name)
        if asked is None:
            try:
                agent = self.ray.get_actor(name)
            except ValueError:  # gone from Ray's names: it died
                return False
            self._asked[name] = (agent.alive.remote(), time.monotonic())
            return True  # not known yet
        ref, since = asked
        done, _ = self.ray.wait([ref], timeout=0)
        if not done:
            if time.monotonic() - since > ALIVE_TIMEOUT_S:
                del self._asked[name]  # slow, not dead: the node's own death is seen by Ray and reported; ask again
            return True
        del self._asked[name]
        try:
            return bool(self.ray.get(ref))
        except self.ray.exceptions.RayError:
            return False

    def poll(self, handle: dict) -> ExecStatus:
        folder = JobFolder(Path(handle["job_dir"]))
        if handle.get("unknown") is not None:
            prefix = _agent_prefix(handle["unknown"])
            for actor in self.ray.util.list_named_actors():
                if actor.startswith(prefix):
                    self._kill_named(actor)
            return ExecStatus(finished=True, lost=True, reason="the server stopped while the job was starting")
        nodes = handle["nodes"]
        results = {}
        for node, h in nodes.items():
            result = folder.read_result(_part_of(h))
            if isinstance(result, dict):
                results[node] = result
        codes = folder.exit_codes()
        lost = [node for node in nodes if node not in results and not self._alive(nodes[node]["agent"])]
        if lost:
            folder.ask_stop(f"node {', '.join(lost)} was lost")
        elif any(c != 0 for c in codes.values()):
            bad = min(r for r, c in codes.items() if c != 0)
            folder.ask_stop(f"rank {bad} failed on another node")
        if len(results) + len(lost) < len(nodes):
            return ExecStatus(finished=False, exit_codes=codes, phase=folder.read_phase())
        for h in nodes.values():
            self._kill_named(h["agent"])
            self._asked.pop(h["agent"], None)
        reasons = [r["reason"] for r in results.values() if r.get("reason")]
        if lost:
            return ExecStatus(finished=True, exit_codes=codes, lost=True, lost_nodes=tuple(lost),
                              reason=f"node {', '.join(lost)} was lost")
        return ExecStatus(finished=True, exit_codes=codes, reason=_first_cause(reasons),
                          stopped=any(r.get("stopped") for r in results.values()))

    def terminate(self, handle: dict) -> None:
        JobFolder(Path(handle["job_dir"])).ask_stop("stop")

    def usage(self, handle: dict) -> None:
        """Not measured: the workers' processes are on Ray's nodes, out of this machine's sight."""
        return None


class RayAutoscaler:
    """Ray's own autoscaler (its cluster config's node types provide the burst nodes):
    ``request_resources`` says how many of each to keep, its status what failed."""

    def __init__(self, executor: RayExecutor):
        self.executor = executor

    def request(self, nodes: dict[str, int], kept: set[str]) -> None:
        from ray.autoscaler.sdk import request_resources

        self.executor.leave_alone(kept)
        request_resources(bundles=[{res: 1} for res, count in sorted(nodes.items()) for _ in range(count)])

    def notes(self) -> dict[str, str]:
        import json

        from ray.experimental.internal_kv import _internal_kv_get

        try:
            raw = _internal_kv_get("__autoscaling_status")  # what `ray status` reads (monitor.py writes it)
        except Exception as exc:  # the head does not answer now: nothing new to report
            log.info("the autoscaler's status was not read: %s", exc)
            return {}
        report = (json.loads(raw) if raw else {}).get("autoscaler_report") or {}
        out: dict[str, str] = {}
        for node_type, count in (report.get("pending_launches") or {}).items():
            if count:
                out[node_type] = f"{count} launch{'es' if count > 1 else ''} of node type {node_type} pending"
        for _ip, node_type in report.get("failed_nodes") or []:
            out[node_type] = "a node of this type started but failed its setup"
        for node_type, rec in ((report.get("node_availability_summary") or {}).get("node_availabilities")
                               or {}).items():
            info = rec.get("unavailable_node_information") or {}
            if not rec.get("is_available", True) and info:
                out[node_type] = f"{info.get('category', '')}: {info.get('description', '')}".strip(": ")
        return out


def _part_of(node: dict) -> int:
    """Which part of the job a node ran (handles recorded before: from the result file's name)."""
    if "part" in node:
        return int(node["part"])
    return int(str(node["result"]).removeprefix("result-").removesuffix(".json"))


def _first_cause(reasons: list[str]) -> str:
    """The failing node's reason before the ones it caused elsewhere."""
    own = [r for r in reasons if "on another node" not in r]
    return (own or reasons or [""])[0]

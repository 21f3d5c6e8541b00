"""Composes the control plane: store, inventory, executor, reconcile loop, API."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from sqlalchemy import inspect as sa_inspect
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from deeppod import memory
from deeppod.atomic import atomic_write
from deeppod.audit import service as audit
from deeppod.audit.log import AuditLog
from deeppod.auth import tls
from deeppod.auth.cache import PrincipalCache
from deeppod.auth.identities import Identities, SystemIdentities
from deeppod.auth.paths import TenantRoots
from deeppod.auth.service import bootstrap
from deeppod.cluster.gpus import GpuProbe, default_probe
from deeppod.cluster.inventory import NodeInfo, local_node
from deeppod.cluster.leader import RENEW_S, Leadership, leader_url, session_name, urls_first
from deeppod.cluster.readings import OneNode, PsutilHostSampler, default_gpu_sampler
from deeppod.cluster.service import register_node, sync_nodes
from deeppod.contract import free_port, own_python_first
from deeppod.datasets import service as datasets
from deeppod.datasets.ingest import Limits
from deeppod.datasets.tiers import Tiers
from deeppod.deployments.balancer import Balancer
from deeppod.deployments.controller import DeploymentController
from deeppod.envs import service as envs
from deeppod.envs.build import Builds
from deeppod.errors import InvalidRequest
from deeppod.executor.base import Executor
from deeppod.executor.fenced import FencedExecutor
from deeppod.executor.local import LocalExecutor
from deeppod.experiments.controller import ExperimentController
from deeppod.experiments.service import TrialLauncher
from deeppod.jobs import retention
from deeppod.jobs import service as jobs_service
from deeppod.jobs.code import CODE_KEEP_S, CodeStore
from deeppod.jobs.controller import JobController
from deeppod.jobs.launch import Isolation
from deeppod.jobs.quotas import StorageMeter
from deeppod.loops import run_ticks
from deeppod.models import artifacts
from deeppod.models import service as models
from deeppod.monitor import service as monitoring
from deeppod.monitor.loop import Monitor
from deeppod.notebooks import idle as notebook_idle
from deeppod.posix_acl import keep_private
from deeppod.scheduler import Config
from deeppod.scheduler.phases import HANDED_OFF
from deeppod.scheduler.plan import MIN_PIDS
from deeppod.settings import SERVER_FILE, Settings, local_server_record
from deeppod.store import sealed
from deeppod.store.db import make_engine, make_sessionmaker, on_commit_of, read_only
from deeppod.store.migrate import upgrade
from deeppod.store.models import Deployment, DeploymentKey, Experiment, Job, Node, Tenant, Token, Trial, User

log = logging.getLogger(__name__)


@dataclass
class ServerContext:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    executor: Executor
    jobs: JobController
    data: datasets.DataPlane
    balancer: Balancer
    deployments: DeploymentController
    principals: PrincipalCache
    audit: AuditLog
    roots: TenantRoots | None = None  # where tenants' jobs may work; None: anywhere (single-user)
    tls: tls.Served | None = None  # None: plain HTTP
    code: CodeStore | None = None  # jobs' code sent with them (PUT /v1/code)
    leader: Leadership = None  # this server's claim to lead a failover control plane (always set by build)
    node: NodeInfo | None = None  # this machine as a node (the local executor); None: a cluster executor's
    experiments: ExperimentController | None = None  # runs hyperparameter searches (always set by build)
    monitor: Monitor | None = None  # samples GPUs and hosts: this machine, or every Ray node
    read_sessions: sessionmaker[Session] | None = None  # for what only reads (GET requests; store/db.read_only)


def resolve_isolation(asked: str, supported=None) -> str:
    """``auto`` (the default): ``sandbox`` where this server can build sandboxes (root,
    namespaces), so jobs never run as its identity; else ``one-tenant``."""
    if asked not in ("auto", "sandbox", "single-user", "one-tenant"):
        raise InvalidRequest(f"DEEPPOD_ISOLATION={asked!r}: use auto, sandbox, single-user or one-tenant")
    if asked != "auto":
        return asked
    if supported is None:
        from deeppod.executor.sandbox import supported
    return "sandbox" if supported() is None else "one-tenant"


def isolation_for(settings: Settings, identities: Identities | None = None) -> Isolation | None:
    """The isolation the settings ask for (resolved: not ``auto``), or a clear error if this
    machine cannot give it."""
    if settings.job_network not in jobs_service.NETWORKS:
        raise InvalidRequest(f"DEEPPOD_JOB_NETWORK={settings.job_network!r}: use {', '.join(jobs_service.NETWORKS)}")
    if settings.isolation in ("one-tenant", "single-user"):
        if settings.job_network != "host":
            raise InvalidRequest(f"DEEPPOD_JOB_NETWORK={settings.job_network} needs sandbox isolation (as root): "
                                 "jobs that run as the server's identity share its network")
        return None
    if settings.isolation != "sandbox":
        raise InvalidRequest(f"DEEPPOD_ISOLATION={settings.isolation!r}: use auto, sandbox, single-user or one-tenant")
    real = identities is None  # else a test's fake identities: nothing is sandboxed for real
    if identities is None:
        from deeppod.executor import sandbox

        why = sandbox.supported()
        if why is not None:
            raise InvalidRequest(f"sandbox isolation is not possible: {why}; start the server as root, or with "
                                 "--isolation single-user for one trusted user")
        identities = SystemIdentities()
    home = os.path.realpath(settings.home)
    for template in settings.tenant_roots():
        fixed = os.path.realpath(template.split("{tenant}")[0] or "/")
        if home == fixed or home.startswith(fixed.rstrip("/") + "/"):
            raise InvalidRequest(f"the work root {template} holds the server's home {home}: a tenant's jobs would "
                                 "work beside the database and other jobs' folders; pick roots outside it")
    if settings.cpu_limit not in ("share", "quota"):
        raise InvalidRequest(f"DEEPPOD_CPU_LIMIT={settings.cpu_limit!r}: use share (CPU time by weight of "
                             "--cpus-per-worker) or quota (also a hard cap at that many CPUs)")
    if settings.pids_per_worker < MIN_PIDS:
        raise InvalidRequest(f"DEEPPOD_PIDS_PER_WORKER={settings.pids_per_worker}: give at least {MIN_PIDS}")
    from deeppod.executor import cgroups

    why = cgroups.check() if real else "no real sandbox"
    if real and why is not None and not settings.unenforced_limits:
        raise InvalidRequest(f"sandbox isolation needs the kernel's control groups to hold each job to its memory, "
                             f"processes and CPUs, and they cannot be used here ({why}); give the server a writable "
                             "cgroup (v2, or the v1 memory, pids and cpu controllers), or start it with "
                             "--unenforced-limits to go on without them (docs/security.md says what that leaves)")
    if real and why is not None:  # the supervisor's memory poll stands in (docs/security.md says what that misses)
        log.warning("sandboxed jobs' memory, process and CPU limits are not enforced by the kernel here (%s): "
                    "a worker's memory is polled instead, its processes and CPU are not limited", why)
    return Isolation(identities, python_environment(home), instance=settings.instance, cgroups=why is None,
                     pids=settings.pids_per_worker, cpu_quota=settings.cpu_limit == "quota")


def python_environment(home: str) -> tuple[str, ...]:
    """What every sandbox gets read-only to run Python and import deeppod: the interpreter's
    prefixes and the import path, less the folder the server was started from (sys.path[0]:
    anything may lie there) and anything that holds the server's home."""
    found = {sys.prefix, sys.base_prefix, *(p for p in sys.path[1:] if p and os.path.isdir(p))}
    found.add(str(Path(__file__).resolve().parents[1]))  # deeppod itself, wherever it was imported from
    return tuple(sorted(p for p in found if not (home + "/").startswith(os.path.realpath(p).rstrip("/") + "/")))


def build(settings: Settings, *, executor: Executor | None = None, probe: GpuProbe | None = None,
          identities: Identities | None = None, fenced: bool = False) -> ServerContext:
    """Everything a server holds. ``fenced``: it may share its database with other servers
    (``serve``): it decides and acts only while it leads (cluster/leader.py) and ``lead_loop``
    starts the leader's work; else it leads alone and is ready to run rounds at once (tests)."""
    settings = replace(settings, isolation=resolve_isolation(settings.isolation))
    isolation = isolation_for(settings, identities)
    settings.home.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.home, 0o700)  # the database, tokens and every job's folder are the server's
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    sealed.configure(settings.secret_key.encode() or _secret_key(settings.home / "secret.key"))
    server_id = uuid.uuid4().hex
    engine = make_engine(settings.db_url, name=session_name(server_id))
    upgrade(engine)
    _private_sqlite(engine)
    sessions = make_sessionmaker(engine)
    with sessions.begin() as s:
        if sealed_now := jobs_service.seal_legacy_env(s):
            log.info("sealed the --env values of %d jobs stored before sealing", sealed_now)
    leader = _leadership(settings, sessions, server_id, fenced)
    executor = executor or executor_for(settings)
    if settings.executor == "slurm":
        _home_for_slurm(settings)
    check_cluster_auth(settings, isolation, executor)
    if fenced:
        executor = FencedExecutor(executor, leader.check)
    node = None if cluster_nodes(executor) is not None else local_node(
        probe or default_probe(settings.gpus, settings.gpu_memory_mb), cpus=settings.cpus, memory_mb=settings.memory_mb)
    data = datasets.DataPlane(Tiers(settings.hot_root, settings.cold_root),
                              Limits(settings.data_max_file_bytes, settings.data_max_ingest_bytes),
                              settings.data_cold_after_seconds, server_id=leader.id)
    config = scheduler_config(settings, executor)
    settings.models_dir.mkdir(parents=True, exist_ok=True)
    served = tls.prepare(settings.home, settings.tls_cert, settings.tls_key, settings.tls_ca,
                         [settings.host, "localhost", "127.0.0.1", "::1", node.address if node else "127.0.0.1",
                          socket.gethostname()]) if settings.tls_cert else None

    def on_finished(session: Session, job) -> None:
        if job.kind == "evaluate":
            models.absorb_evaluation(session, job, settings.jobs_dir)

    jobs = JobController(sessions, executor, jobs_dir=settings.jobs_dir, api_url=settings.public_url, config=config,
                         stage=lambda version_id: datasets.stage(sessions, data, version_id),
                         on_finished=on_finished, isolation=isolation,
                         ca_cert=str(served.trust) if served and served.trust else None,
                         fence=leader.fence if fenced else None, spares=settings.spare_workers,
                         autoscaler=executor.autoscaler() if hasattr(executor, "autoscaler") else None)
    jobs.launcher.envs = Builds(str(settings.envs_root), _uv(), settings.env_index)
    jobs.launcher.image_dir = settings.image_dir
    balancer = Balancer()
    deployments = DeploymentController(sessions, balancer, models_root=settings.models_dir,
                                       default_grace=settings.grace_seconds,
                                       max_body_bytes=settings.predict_max_bytes,
                                       **({"leading": lambda: leader.leading, "fence": leader.fence} if fenced else {}))
    read_sessions = read_only(sessions)  # one for the server: GET requests, token lookups
    roots = TenantRoots(settings.tenant_roots()) if isolation else None
    ctx = ServerContext(settings, engine, sessions, executor, jobs, data, balancer, deployments,
                        PrincipalCache(read_sessions), AuditLog(sessions), roots, served,
                        CodeStore(settings.code_dir, settings.code_max_bytes, settings.code_tenant_bytes),
                        leader, node)
    launcher = TrialLauncher(settings.experiments_dir, settings.jobs_dir, settings.models_dir, settings.grace_seconds,
                        roots, ctx.code, settings.job_network, settings.image_dir)
    ctx.read_sessions = read_sessions
    ctx.experiments = ExperimentController(sessions, launcher, fence=leader.fence if fenced else lambda s: None,
                                          leading=lambda: leader.leading)
    source = (OneNode(node.name, default_gpu_sampler(settings.gpus), PsutilHostSampler(str(settings.home)))
              if node is not None else executor.samplers())
    if source is not None:
        policy = monitoring.Policy(idle_util=settings.monitor_idle_percent, idle_after_s=settings.monitor_idle_seconds,
                                   raw_keep_s=settings.monitor_raw_seconds,
                                   retention_s=settings.monitor_retention_days * 86400)
        ctx.monitor = Monitor(sessions, source, policy, fence=leader.fence if fenced else lambda s: None,
                              usage=executor.usage)
    _on_commits(ctx)
    if not fenced:
        leader.epoch = 0  # it leads alone, without a lease
        take_over(ctx, first=True)
    return ctx


def _on_commits(ctx: ServerContext) -> None:
    """What a commit in this process sets off: an idle loop sleeps until what it acts on is
    committed here (a standby's: its next idle round); a revoked token is refused at once."""
    on_commit_of(ctx.sessions, (Token, User, Tenant), ctx.principals.clear)
    on_commit_of(ctx.sessions, (Job,), ctx.jobs.wake.set)
    on_commit_of(ctx.sessions, (Deployment, DeploymentKey, Job), ctx.deployments.wake.set)  # a replica is a job
    on_commit_of(ctx.sessions, (Experiment,), ctx.experiments.wake.set)
    # a search's next trial is asked for as soon as its last one starts (or one ends), and a
    # new trial is started at once, not a round of each loop later: 16 parallel trials of a
    # few seconds each keep 16 running
    on_commit_of(ctx.sessions, (Trial,), ctx.jobs.hurry.set, added_only=True)
    on_commit_of(ctx.sessions, (Job,), ctx.experiments.hurry.set, which=_trial_moved)


def _trial_moved(job: Job) -> bool:
    return job.kind == "trial" and sa_inspect(job).attrs.state.history.has_changes()


def _private_sqlite(engine) -> None:
    if engine.url.get_backend_name() == "sqlite" and engine.url.database:
        for suffix in ("", "-wal", "-shm"):  # the database holds token hashes and jobs' --env values
            if os.path.exists(engine.url.database + suffix):
                os.chmod(engine.url.database + suffix, 0o600)


def _leadership(settings: Settings, sessions: sessionmaker[Session], server_id: str, fenced: bool) -> Leadership:
    """SQLite: one server (serve holds a lock on the file), which leads without renewals; on
    PostgreSQL the lease has connections of its own, so the API's load cannot delay a renewal."""
    solo = sessions.kw["bind"].dialect.name == "sqlite"
    lease_sessions = sessions if solo or not fenced else make_sessionmaker(
        make_engine(settings.db_url, name=session_name(server_id), pool_size=2))
    return Leadership(lease_sessions, settings.public_url, server_id=server_id, solo=solo)


def take_over(ctx: ServerContext, *, first: bool) -> None:
    """What a server does as it starts to lead: see the nodes, and undo what servers that died
    left half done (ingests, moves, model uploads). Everything is undone only at a first start
    with no other server running; otherwise only the work of servers that are gone."""
    with ctx.sessions.begin() as s:
        nodes = cluster_nodes(ctx.executor)
        if nodes is None:
            register_node(s, ctx.node)
        else:
            sync_nodes(s, nodes(), ctx.executor.names_kept)
    live = ctx.leader.live_ids()
    alone = first and live == {ctx.leader.id}
    datasets.recover(ctx.sessions, ctx.data, None if alone else live)
    if alone:
        artifacts.sweep(ctx.settings.models_dir)


def scheduler_config(settings: Settings, executor: Executor) -> Config:
    """The round's settings; where the cluster has a scheduler of its own, the round only hands jobs to it."""
    return Config(aging_seconds=settings.aging_seconds, reserve_after_seconds=settings.reserve_after_seconds,
                  min_run_before_resize=settings.resize_after_seconds, las_thresholds=settings.las_thresholds,
                  defragment=settings.defragment, **({"phases": HANDED_OFF} if executor.queues else {}))


def executor_for(settings: Settings) -> Executor:
    if settings.executor == "local":
        return LocalExecutor()
    if settings.executor == "ray":
        if not settings.ray_address:
            raise InvalidRequest("--executor ray needs --ray-address HEAD:6379 (the address 'ray start --head' "
                                 "printed)")
        from deeppod.executor.ray import RayExecutor

        return RayExecutor(settings.ray_address, gpus_per_node=settings.gpus_per_node, instance=settings.instance)
    if settings.executor == "slurm":
        from deeppod.executor.slurm import SlurmCli, SlurmExecutor

        return SlurmExecutor(SlurmCli(settings.slurm_conf or None), instance=settings.instance,
                             partition=settings.slurm_partition or None, python=settings.slurm_python or None,
                             pythonpath=settings.slurm_pythonpath or None)
    raise InvalidRequest(f"DEEPPOD_EXECUTOR={settings.executor!r}: use local, ray or slurm")


def _home_for_slurm(settings: Settings) -> None:
    """On Slurm a job's tasks run as its identity with no sandbox to bind its folder in: they reach
    it through HOME (on the shared file system), which they may cross but not list; everything else
    in it is the server's alone, made so from now on (umask) and already (what an earlier start made)."""
    os.umask(0o077)
    for entry in settings.home.iterdir():
        if entry.is_dir() and not entry.is_symlink() and entry != settings.jobs_dir:
            keep_private(entry)  # jobs given a way through (their datasets, environments) keep it
    os.chmod(settings.home, 0o711)
    os.chmod(settings.jobs_dir, 0o711)


def _uv() -> str | None:
    """The uv program jobs' environments are built with (beside this Python, or on PATH); None: venv and pip."""
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.is_file() else shutil.which("uv")


def check_cluster_auth(settings: Settings, isolation: Isolation | None, executor) -> None:
    """Sandboxed jobs on a Ray cluster: the cluster must ask for Ray's token (anything that
    reaches an unauthenticated cluster's ports runs code as the Ray nodes' identity)."""
    if isolation is not None and getattr(executor, "authenticated", True) is False and not settings.ray_without_auth:
        raise InvalidRequest("this Ray cluster is used without Ray's token authentication, so a sandboxed job on the "
                             "host's network could reach its ports and run code as the Ray nodes' identity: start Ray "
                             "and this server with RAY_AUTH_MODE=token and the cluster's RAY_AUTH_TOKEN "
                             "(docs/cluster.md), or set DEEPPOD_RAY_WITHOUT_AUTH=1 on a network only trusted users "
                             "reach")


def cluster_nodes(executor: Executor):
    """A cluster executor's ``nodes()`` (its nodes come and go), or None: this machine is the node."""
    return executor.nodes if executor.cluster else None


SLOW_CLUSTER_S = 10.0  # a cluster that takes longer to list its nodes is reported


def inventory_loop(ctx: ServerContext, stop: threading.Event, interval: float = 2.0) -> None:
    """A cluster executor's nodes into the store: one that joins appears, one that leaves is
    down. A round that fails is retried; a cluster that does not answer keeps its last view."""
    if not stop.wait(interval):
        run_ticks(lambda: inventory_round(ctx), stop, interval, "node inventory")


def inventory_round(ctx: ServerContext) -> None:
    began = time.monotonic()
    infos = ctx.executor.nodes()
    if (late := time.monotonic() - began) > SLOW_CLUSTER_S:
        # jobs keep running on the nodes meanwhile; only DeepPod's view of them waited
        log.warning("the cluster did not answer for %.0f s (its head, or the network to it): jobs on its "
                    "nodes kept running, DeepPod's actions on them waited; it answers again", late)
    with ctx.sessions.begin() as s:
        for name in sync_nodes(s, infos, ctx.executor.names_kept):
            log.warning("node %s left the cluster: marked down", name)


def lead_loop(ctx: ServerContext, stop: threading.Event, ready: threading.Event | None = None) -> None:
    """Every RENEW_S seconds: this server's heartbeat, and its claim on the lease. While it
    leads, the reconcile loop, the executor's node inventory and housekeeping run; when it
    loses the lead they stop at once. A clean shutdown gives the lease up for a standby."""
    term: tuple[threading.Event, list[threading.Thread]] | None = None
    first = True
    while True:
        if ctx.leader.heartbeat():
            if term is None:
                term = _lead(ctx, first)
            # every beat (read in the heartbeat's own transaction): a job started a second after a
            # server joined reaches it after a failover; jobs reach every live server, this one first
            ctx.jobs.launcher.api_url = urls_first(ctx.settings.public_url, ctx.leader.live_urls)
        elif term is not None:
            log.warning("stepping down: the reconcile loop and the executor stop here")
            _step_down(term)
            term = None
        first = False
        if ready is not None:
            ready.set()
        if stop.wait(RENEW_S):
            break
    if term is not None:
        _step_down(term)
    ctx.leader.release()


def _lead(ctx: ServerContext, first: bool) -> tuple[threading.Event, list[threading.Thread]]:
    try:
        take_over(ctx, first=first)
    except Exception:  # the inventory loop and housekeeping retry what failed here
        log.exception("taking over: could not check the nodes or undo dead servers' work")
    end = threading.Event()
    settings = ctx.settings
    threads = [threading.Thread(target=ctx.jobs.run, args=(end, settings.reconcile_interval), name="reconcile",
                                daemon=True),
               threading.Thread(target=ctx.experiments.run, args=(end, max(0.5, settings.reconcile_interval)),
                                name="experiments",
                                daemon=True),
               threading.Thread(target=housekeeping_loop, args=(ctx, end, settings.housekeeping_interval),
                                name="housekeeping", daemon=True)]
    if settings.notebook_idle_interval > 0:
        threads.append(threading.Thread(target=run_ticks, args=(lambda: notebook_idle.idle_round(ctx.sessions), end,
                                                                 settings.notebook_idle_interval, "idle notebooks"),
                                        name="notebooks", daemon=True))
    if settings.storage_interval > 0:
        meter = StorageMeter(ctx.sessions, settings.jobs_dir, settings.envs_root)
        threads.append(threading.Thread(target=run_ticks, args=(meter.tick, end, settings.storage_interval,
                                                                 "storage quotas"), name="storage", daemon=True))
    if ctx.monitor is not None and settings.monitor_period > 0:
        threads.append(threading.Thread(target=ctx.monitor.run, args=(end, settings.monitor_period), name="monitor",
                                        daemon=True))
    if cluster_nodes(ctx.executor) is not None:
        threads.append(threading.Thread(target=inventory_loop, args=(ctx, end), name="inventory", daemon=True))
    for t in threads:
        t.start()
    return end, threads


def _step_down(term: tuple[threading.Event, list[threading.Thread]]) -> None:
    end, threads = term
    end.set()
    for t in threads:
        t.join(timeout=10)


def _secret_key(path: Path) -> bytes:
    """The key that seals jobs' --env values: kept in the server's home, made on first start."""
    if not path.exists():
        atomic_write(path, sealed.new_key())
    return path.read_bytes().strip()


def housekeeping_loop(ctx: ServerContext, stop: threading.Event, interval: float) -> None:
    """Every ``interval`` seconds (DEEPPOD_HOUSEKEEPING_INTERVAL): move idle dataset versions
    to the cold tier, remove the folders of jobs past the retention, drop old audit events."""
    if not stop.wait(interval):
        run_ticks(lambda: housekeeping_round(ctx), stop, interval, "housekeeping")


def housekeeping_round(ctx: ServerContext) -> None:
    """Each chore on its own: one that fails does not keep the others from their turn."""
    try:
        moved = datasets.demote_idle(ctx.sessions, ctx.data)
        if moved:
            log.info("moved to cold: %s", ", ".join(moved))
    except Exception:  # the next round retries
        log.exception("tiering tick failed")
    try:
        purged = retention.apply_retention(ctx.sessions, ctx.settings.jobs_dir, ctx.settings.job_retention_days)
        if purged:
            log.info("removed the folders of %d finished jobs (retention)", len(purged))
    except Exception:  # the next round retries
        log.exception("retention tick failed")
    try:  # a server of a failover control plane that died mid-ingest: undo its ingests
        datasets.recover(ctx.sessions, ctx.data, ctx.leader.live_ids())
        ctx.leader.forget_dead()
    except Exception:  # the next round retries
        log.exception("recovering dead servers' work failed")
    try:  # jobs' environments over the cache's cap: least recently used first, none in use
        with ctx.sessions() as s:
            envs.prune(s, ctx.settings.envs_root, int(ctx.settings.env_cache_gb * 1e9))
    except Exception:  # the next round retries
        log.exception("environment cache tick failed")
    if ctx.code is not None and (dropped := ctx.code.prune(CODE_KEEP_S)):
        log.info("dropped %d code archives unused for a week", dropped)
    try:
        with ctx.sessions.begin() as s:
            audit.apply_retention(s, ctx.settings.audit_retention_days)
    except Exception:  # the next round retries
        log.exception("audit retention tick failed")


def bootstrap_admin(ctx: ServerContext) -> str | None:
    """First start only: create the admin and keep its token in DEEPPOD_HOME (mode 0600)."""
    with ctx.sessions.begin() as s:
        secret = bootstrap(s)
    if secret:
        atomic_write(ctx.settings.home / "admin.token", secret + "\n")
    return secret


QUIET_LOGGERS = ("httpx", "httpcore")  # a line per proxied predict and health check at INFO


def configure_logging(level: str) -> None:
    """The server process's logging: LEVEL for DeepPod; HTTP client chatter only at DEBUG."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING)


def announce_local(settings: Settings, ca_cert: Path | None = None) -> list[Path]:
    """Let the CLI and SDK on this machine find this server whatever its port or home, and
    trust its certificate (settings.ClientSettings reads these). Returns the files to remove
    at shutdown."""
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    url = f"{settings.scheme}://{host}:{settings.port}"
    doc = {"url": url, "pid": os.getpid(), "home": str(settings.home), "ca_cert": str(ca_cert) if ca_cert else None}
    paths = [settings.home / SERVER_FILE, local_server_record(settings.home)]
    for path in paths:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            atomic_write(path, json.dumps(doc))
        except OSError as exc:  # a read-only config folder only costs the discovery
            log.warning("could not write %s (%s); the CLI needs --url for this server", path, exc)
    return paths


def forget_local(paths: list[Path]) -> None:
    """This server stops: it is no longer found as running. Its record beside the login config
    keeps its URL (with no pid), so a CLI that cannot reach it names the port it last used."""
    for path in paths:
        try:
            doc = json.loads(path.read_text())
            if doc.get("pid") != os.getpid():
                continue
            if path.name != SERVER_FILE:
                atomic_write(path, json.dumps({**doc, "pid": None}))
            else:
                path.unlink()
        except (OSError, ValueError):
            pass


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _only_server_of(settings: Settings):
    """On SQLite, this server is the only one of its database (several servers need
    PostgreSQL): a lock on a file beside it, held for the life of the process, the kernel's
    word that no other server of this machine uses it. Returns the open lock file (None on
    PostgreSQL); refuses to start while another server holds it."""
    if not settings.db_url.startswith("sqlite"):
        return None
    path = Path(settings.db_url.split("///", 1)[-1] + ".server-lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    held = open(path, "a+")
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.seek(0)
        other = held.read().strip() or "another process"
        held.close()
        raise InvalidRequest(f"another DeepPod server ({other}) uses the database {path.with_suffix('')}: stop it "
                             "first, or give this one another --home; several servers on one database need "
                             "PostgreSQL (--database-url)") from None
    held.truncate(0)
    held.write(f"pid {os.getpid()}")
    held.flush()
    return held


def check_ports(settings: Settings) -> None:
    """The API's port, and S3's own (--s3-port) where it has one, are free and not the same."""
    _check_port_free(settings.host, settings.port)
    if settings.s3_port is not None:
        if settings.s3_port == settings.port or not 0 < settings.s3_port < 65536:
            raise InvalidRequest(f"--s3-port {settings.s3_port}: give a port of its own (1-65535), not the API's "
                                 f"({settings.port})")
        _check_port_free(settings.host, settings.s3_port)


def _check_port_free(host: str, port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise InvalidRequest(f"cannot listen on {host}:{port} ({exc.strerror}): is another server running? "
                                 "Stop it or pass --port") from None


def http_app(ctx: ServerContext):
    """What the server serves: the API, at / the web console (it calls the same services), and
at /s3 the S3 endpoint over its storage; large bodies go from file to socket (transport/zerocopy.py)."""
    from deeppod import s3, ui
    from deeppod.api.app import create_app
    from deeppod.transport.zerocopy import ZeroCopySend

    # outside Starlette's own error middleware, which wraps uvicorn's send: S3 sends files by sendfile
    return ZeroCopySend(create_app(ctx, parts=(ui, s3)))


def _s3_port_server(ctx: ServerContext, settings: Settings, cert_key: dict, echo):
    """S3 at the root of its own port (--s3-port), beside the API: the same keys, buckets and
    files, in a thread of its own (uvicorn leaves signals to the main thread's server)."""
    import uvicorn

    from deeppod.audit.log import AuditMiddleware
    from deeppod.s3.app import own_port_app
    from deeppod.transport.zerocopy import ZeroCopySend

    if settings.s3_port is None:
        return None
    app = ZeroCopySend(AuditMiddleware(own_port_app(ctx), audit=ctx.audit))  # audited as /s3 is
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.s3_port,
                                           log_level=settings.log_level.lower(), access_log=False, lifespan="off",
                                           **cert_key))
    threading.Thread(target=server.run, name="s3-port", daemon=True).start()
    scheme = "https" if cert_key else "http"
    echo(f"S3: {settings.url}/s3, and at the root of {scheme}://{settings.host}:{settings.s3_port} (clients that "
         "take a host: MinIO's SDK, mc)")
    return server


def prefer_own_python() -> None:
    """Jobs' PATH starts with the server's interpreter's folder: their ``python`` has DeepPod."""
    os.environ["PATH"] = own_python_first(os.environ.get("PATH", os.defpath))


def serve(settings: Settings, *, echo=print) -> None:
    import uvicorn

    logging.getLogger("alembic").setLevel(logging.WARNING)  # migrations are routine; errors still show
    memory.limit_arenas()  # before the threads: fewer arenas for the thread pool to fragment
    prefer_own_python()
    if settings.port == 0:  # any free port: pick it now, so the URL jobs and the CLI are told is a real one
        settings = replace(settings, port=free_port(settings.host))
    check_ports(settings)
    database_lock = _only_server_of(settings)  # SQLite: held until the server stops
    ctx = build(settings, fenced=True)
    settings = ctx.settings  # its isolation resolved
    ctx.leader.join()
    secret = bootstrap_admin(ctx)
    app = http_app(ctx)
    stop = threading.Event()
    ready = threading.Event()
    lead = threading.Thread(target=lead_loop, args=(ctx, stop, ready), name="leadership", daemon=True)
    lead.start()
    ready.wait(60)  # the first claim on the lease (and a leader's first take-over) before the API answers
    echo(f"DeepPod server {settings.url}  (web console: {settings.url}/, API docs: {settings.url}/docs)")
    echo(f"state: {settings.home}  database: {ctx.engine.url.render_as_string(hide_password=True)}")
    with ctx.sessions() as s:
        leader = leader_url(s)
    if ctx.leader.leading:
        echo("control plane: this server runs the jobs, the only server of its SQLite database"
             if ctx.leader.solo else f"control plane: this server leads (epoch {ctx.leader.epoch}) and runs the jobs")
    else:
        echo(f"control plane: standby. The leader is {leader or 'being chosen'}; this server serves the API and "
             "takes over within 10 s if the leader stops")
    if settings.executor == "ray":
        with ctx.sessions() as s:
            up = [n.name for n in s.scalars(select(Node).where(Node.up.is_(True)))]
        echo(f"executor: the Ray cluster at {settings.ray_address}, {len(up)} nodes ({', '.join(up)}); job folders "
             f"in {settings.jobs_dir} must be on storage every node shares")
    if settings.isolation == "one-tenant":
        echo("isolation: none (this server is not root, so it cannot run jobs as other OS identities), so it "
             "holds one tenant. Jobs run as this server's OS identity and can read "
             "its state. For several tenants start it with --isolation sandbox (root; docs/security.md), or with "
             "--single-user if every user trusts every other.")
    elif ctx.roots is None:
        echo("isolation: single-user. Jobs run as this server's OS identity and can read its state (the "
             "database, the tokens, every job's folder): for one trusted user only. Several tenants need "
             "--isolation sandbox (root; docs/security.md).")
    else:
        echo(f"isolation: sandbox. Each tenant's jobs run as its own OS identity in namespaces; "
             f"they work under {os.pathsep.join(settings.tenant_roots())} or in the code sent with them")
    if ctx.tls:
        trust = ctx.tls.trust
        echo(f"TLS: serving {ctx.tls.cert}" + (f"; clients verify it with {trust} (deeppod login --ca-cert {trust}, "
                                       f"or DEEPPOD_CA_CERT)" if trust else ""))
    if secret:
        echo(f"admin token (shown once, also saved to {Path(settings.home) / 'admin.token'}):\n  {secret}")
        echo(f"log in from another shell: deeppod login --url {settings.url} --token {secret}")
    ctx.audit.start()
    threading.Thread(target=ctx.deployments.run, args=(stop, settings.reconcile_interval), name="deployments",
                     daemon=True).start()
    cert_key = {"ssl_certfile": str(ctx.tls.cert), "ssl_keyfile": str(ctx.tls.key)} if ctx.tls else {}
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port,
                                           log_level=settings.log_level.lower(), access_log=False, **cert_key))
    s3_server = _s3_port_server(ctx, settings, cert_key, echo)
    announced = announce_local(settings, ctx.tls.trust if ctx.tls else None)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to the handler
    # that was there before: make that handler an exception, so the clean-up below runs.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_on_signal)
    memory.tune_collector()
    try:
        server.run()
    finally:
        if s3_server is not None:
            s3_server.should_exit = True
        forget_local(announced)
        stop.set()
        lead.join(timeout=15)
        ctx.audit.close()
        ctx.engine.dispose()
        if database_lock is not None:
            database_lock.close()
        log.info("server stopped; running jobs keep running and are re-adopted at the next start")

"""Starting a job's run: its datasets staged, its workers' environments (the job contract),
its sandbox (folders, identity, shared memory) and the launch spec the executor starts."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.auth.identities import PREFIX, Identities, tenant_identity
from deeppod.auth.roles import ALL, NOTEBOOK, REPLICA
from deeppod.auth.service import issue_job_token
from deeppod.auth.tokens import notebook_secret
from deeppod.contract import ENV_CA_CERT, ENV_WORLD_FILE, ENV_WORLD_GENERATION, server_urls, worker_env
from deeppod.envs import images
from deeppod.envs import spec as env_spec
from deeppod.envs.build import Builds
from deeppod.errors import ExecutorError
from deeppod.executor.base import Executor, LaunchSpec, WorkerSpec
from deeppod.executor.cgroups import DEFAULT_PIDS
from deeppod.executor.job_shm import unmount_shm
from deeppod.job_folder import WRITABLE, JobFolder
from deeppod.jobs.quotas import memory_for, pids_for
from deeppod.jobs.runs import run_mark
from deeppod.nofollow import chown_tree
from deeppod.plans.service import plan_now
from deeppod.scheduler import WorkerPlacement
from deeppod.store.models import Job, Node, Tenant

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Isolation:
    """Sandbox every worker as its tenant's OS identity (docs/security.md)."""

    identities: Identities
    python: tuple[str, ...]  # the Python environment, read-only in every sandbox
    instance: str = ""  # Settings.instance: in every name on the host, so two installations never share one
    cgroups: bool = False  # the kernel enforces each worker's memory, processes and CPU (executor/cgroups.py)
    pids: int = DEFAULT_PIDS  # a worker's processes and threads, unless its job or plan says otherwise
    cpu_quota: bool = False  # a hard cap at its CPUs (DEEPPOD_CPU_LIMIT=quota), not only a weight
    writable: tuple[str, ...] = WRITABLE  # of its folder: the job's to write
    shm_root: str = "/dev/shm"  # where each job's shared memory folder is made

    @property
    def user_prefix(self) -> str:
        """A new tenant's OS user is this and its id (Linux names end at 32 characters)."""
        return f"deeppod-{self.instance}-t" if self.instance else PREFIX


@dataclass(frozen=True)
class Rendezvous:
    """Where a run's workers meet: rank 0's address and a port free there."""

    master_addr: str
    master_port: int


def own_network(api_url: str) -> tuple[str, list[list]]:
    """A job in a network of its own reaches each API server at a port of its loopback, which
    the proxy forwards (executor/netns.py): the URLs it is given, and [local port, host, port]
    for each."""
    urls, forwards, used = [], [], set()
    for url in server_urls(api_url):
        parts = urllib.parse.urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        local = port if port not in used else max(used) + 1
        used.add(local)
        forwards.append([local, parts.hostname, port])
        urls.append(f"{parts.scheme}://127.0.0.1:{local}{parts.path}")
    return ",".join(urls), forwards


def shm_name(instance: str, job_id: int) -> str:
    """A sandboxed job's shared memory folder under /dev/shm, its installation's and its own."""
    return f"deeppod-{instance}-job-{job_id}" if instance else f"deeppod-job-{job_id}"


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    if root.stat().st_uid == uid:  # done at an earlier start of the job (the root goes last)
        return
    chown_tree(root, uid, gid)


def _private_folder(path: Path, uid: int, gid: int) -> None:
    """``path`` a real folder (not a link someone planted in a shared place such as /dev/shm),
    owned by ``uid`` and private to it: changed through a descriptor opened without following."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ExecutorError(f"{path} exists and is not a folder ({exc.strerror}: a link?); remove it and start "
                            "the job again") from None
    try:
        if os.fstat(fd).st_uid not in (0, uid):
            raise ExecutorError(f"{path} belongs to another user; remove it and start the job again")
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _same_folder(workdir: str) -> None:
    """A working directory under the tenant's roots was checked, resolved, at submit; by now a
    job of the tenant may have made a part of it a link to somewhere else."""
    if os.path.realpath(workdir) != workdir:
        raise ExecutorError(f"the working directory {workdir} is no longer the folder it was when the job was "
                            "submitted (a part of it is now a link); submit the job again with a real folder")


class Launcher:
    """What the controller needs to start workers: shared by a run's start and an in-place grow."""

    def __init__(self, executor: Executor, *, jobs_dir: Path, api_url: str, base_env: dict[str, str],
                 stage: Callable[[int], str] | None = None, isolation: Isolation | None = None,
                 ca_cert: str | None = None):
        self.executor = executor
        self.jobs_dir = jobs_dir
        self.api_url = api_url
        self.base_env = base_env
        self.stage = stage  # dataset version id -> its folder on the hot tier (copied there if cold)
        self.isolation = isolation
        self.ca_cert = ca_cert  # the file jobs verify the server's TLS certificate with (None: system trust)
        self.envs: Builds | None = None  # where jobs' own Python environments are built (set by the server)
        self.image_dir: str | None = None  # the container images jobs may run in (DEEPPOD_IMAGE_DIR)

    def folder(self, job_id: int) -> JobFolder:
        return JobFolder.of(self.jobs_dir, job_id)

    def stage_datasets(self, wanted: list[dict]) -> dict[str, str]:
        """Bring a job's datasets (``Job.datasets``) to the hot tier before it starts: env var -> folder."""
        if wanted and self.stage is None:
            raise ExecutorError("this server has no dataset store to stage from")
        return {d["env"]: self.stage(d["version_id"]) for d in wanted}

    def rendezvous(self, s: Session, job: Job, node: str) -> Rendezvous:
        """Rank 0's node's address and a port free on it now (in a job's own network: its loopback)."""
        address = "127.0.0.1" if job.network != "host" else \
            s.scalar(select(Node.address).where(Node.name == node)) or "127.0.0.1"
        return Rendezvous(address, self.executor.port_on(node, address))

    def token(self, s: Session, job: Job) -> str:
        scope = {"serve": REPLICA, "notebook": NOTEBOOK}.get(job.kind, ALL)  # a notebook acts as its owner
        return issue_job_token(s, job.user_id, job.id, scope)

    def workers(self, s: Session, job: Job, everyone: list[WorkerPlacement], which: list[WorkerPlacement], *,
                staged: dict[str, str], token: str, meet: Rendezvous, generation: int) -> list[WorkerSpec]:
        """The specs of ``which`` of a world of ``everyone``: each worker's environment, and the
        CPUs its node offers."""
        offered = dict(s.execute(select(Node.name, Node.cpus).where(Node.name.in_({w.node for w in which}))).all())
        node_order = list(dict.fromkeys(w.node for w in everyone))
        specs = []
        for w in which:
            peers = [x for x in everyone if x.node == w.node]
            env = self._env(job, staged, token, rank=w.rank, world_size=len(everyone), local_rank=peers.index(w),
                            local_world_size=len(peers), node_rank=node_order.index(w.node),
                            master_addr=meet.master_addr, master_port=meet.master_port, gpus=w.gpus, cpus=w.cpus,
                            generation=generation)
            if self.isolation:
                env["HOME"] = "/tmp"  # the sandbox's own
            specs.append(WorkerSpec(rank=w.rank, node=w.node, env=env, node_cpus=offered.get(w.node)))
        return specs

    def launch_spec(self, s: Session, job: Job, placed: list[WorkerPlacement],
                    staged: dict[str, str], token: str | None = None) -> LaunchSpec:
        """What the executor starts: ``token`` is the job's (issued here when None)."""
        folder = self.folder(job.id)
        if job.network != "host" and len({w.node for w in placed}) > 1:
            raise ExecutorError(f"--network {job.network} gives a job a network of its own on one node, and its "
                                f"workers were placed on {len({w.node for w in placed})}: submit it with fewer "
                                "workers, or with --network host")
        folder.checkpoints.mkdir(parents=True, exist_ok=True)
        folder.reset_world()
        workers = self.workers(s, job, placed, placed, staged=staged, token=token or self.token(s, job),
                               meet=self.rendezvous(s, job, placed[0].node), generation=0)
        sandbox = self._sandbox(s, job, folder, staged, {w.node for w in placed}) if self.isolation else None
        queue = self._queue_as(s, job) if self.executor.queues else {}
        return LaunchSpec(job_id=job.id, job_dir=folder.root, command=list(job.command), workdir=job.workdir,
                          workers=workers, grace_seconds=job.grace_seconds,
                          memory_mb_per_worker=job.memory_mb_per_worker, sandbox=sandbox, env=self._env_order(job),
                          run=run_mark(job), gpus_per_worker=job.gpus_per_worker, cpus_per_worker=job.cpus_per_worker,
                          time_limit_seconds=job.time_limit_seconds, **queue)

    def _queue_as(self, s: Session, job: Job) -> dict:
        """Where the cluster's own scheduler files the job: its tenant's account and QOS in the plan."""
        plan, tenant = plan_now(s), s.get(Tenant, job.tenant_id).name
        return {"account": plan.nearest(tenant, "slurm_account"), "qos": plan.nearest(tenant, "slurm_qos")}

    def _env_order(self, job: Job) -> dict | None:
        """What the supervisor builds (or finds built) before the job's workers start: its own
        Python environment, keyed by its tenant, requirements, interpreter, platform and index;
        or its container image, unpacked once per node."""
        if job.image:
            if self.isolation is None or self.envs is None or not self.image_dir:
                raise ExecutorError(f"this server runs no container images now (job {job.id} asks for {job.image!r}): "
                                    "submit it again without --image")
            order = images.order_for(job.image, self.image_dir, self.envs.root)
            job.env_key = order["key"]
            return order
        wanted = env_spec.parse(job.requirements, job.python)
        if wanted is None:
            job.env_key = None
            return None
        if self.envs is None:
            raise ExecutorError("this server builds no Python environments for jobs; leave out --requirements")
        index = wanted.index(self.envs.index)
        job.env_key = wanted.key(job.tenant_id, index)
        return {"key": job.env_key, "root": str(Path(self.envs.root) / str(job.tenant_id)),
                "requirements": list(wanted.requirements), "python": wanted.python, "base_python": sys.executable,
                "uv": self.envs.uv, "index": index,
                "layer": [p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p]
                + [str(Path(__file__).resolve().parents[2])]}  # where deeppod itself is imported from

    def _env(self, job: Job, staged: dict[str, str], token: str, *, generation: int, **where) -> dict[str, str]:
        """One worker's environment: the job contract (``where``: its rank, world, rendezvous,
        GPUs), the server's CA, and the world file of an in-place resize."""
        folder = self.folder(job.id)
        api_url = self.api_url if job.network == "host" else own_network(self.api_url)[0]
        models = {m["env"]: m["path"] for m in job.models or []}  # bound read-only: they are in read_paths
        env = worker_env(self.base_env, {**job.env, **staged, **models}, job_id=job.id,
                         checkpoint_dir=str(folder.checkpoints), api_url=api_url, token=token,
                         restart_count=job.restart_count, params=job.params,
                         grace_seconds=job.grace_seconds, **where)
        if self.ca_cert:
            env[ENV_CA_CERT] = self.ca_cert
        if job.kind == "notebook":  # its Jupyter server answers only the proxy, which sends this
            env["JUPYTER_TOKEN"] = notebook_secret(job.id)
        env.update({ENV_WORLD_FILE: str(folder.world_file), ENV_WORLD_GENERATION: str(generation)})
        return env

    def shm(self, job_id: int) -> Path:
        """The job's /dev/shm folder on this host (sandboxed jobs; executor/job_shm.py mounts it)."""
        return Path(self.isolation.shm_root) / shm_name(self.isolation.instance, job_id)

    def remove_shm(self, job_id: int) -> None:
        """What the job shared in memory, gone (its supervisor unmounts it as it ends; one killed
        before it could leaves it mounted)."""
        path = self.shm(job_id)
        unmount_shm(str(path))
        shutil.rmtree(path, ignore_errors=True)

    def _sandbox(self, s: Session, job: Job, folder: JobFolder, staged: dict[str, str], nodes: set[str]) -> dict:
        """What the job's sandbox holds: its folders read-write (owned by its tenant's identity,
        nobody else's to read), its datasets and platform inputs read-only, nothing more."""
        who = tenant_identity(s, self.isolation.identities, job.tenant_id, self.isolation.user_prefix)
        os.chmod(folder.root, 0o711)  # its logs and the supervisor's files stay the server's
        binds = [] if job.workdir == "/" else [[job.workdir, job.workdir, True]]
        if Path(job.workdir).parent == folder.root:  # its own folder (code sent with it): the tenant's to write
            _chown_tree(Path(job.workdir), who.uid, who.gid)
        elif job.workdir != "/":
            _same_folder(job.workdir)
        for name in self.isolation.writable:
            sub = folder.root / name
            sub.mkdir(exist_ok=True)
            os.chown(sub, who.uid, who.gid)
            os.chmod(sub, 0o700)
            binds.append([str(sub), str(sub), True])
        binds += [[path, path, False] for path in [*staged.values(), *(job.read_paths or [])]]
        binds.append([str(folder.world_dir), str(folder.world_dir), False])  # the control plane's word on its size
        if self.ca_cert:
            trust = os.path.dirname(self.ca_cert)
            binds.append([trust, trust, False])
        shm = self.shm(job.id)  # the job's own tmpfs, mounted there by its supervisor
        sandbox = {"uid": who.uid, "gid": who.gid, "workdir": job.workdir, "python": list(self.isolation.python),
                   "binds": binds, "shm": str(shm)}
        if job.network != "host":  # executor/netns.py: the API alone is forwarded (isolated), or nothing (none)
            sandbox["network"] = {"mode": job.network,
                                  "forward": own_network(self.api_url)[1] if job.network == "isolated" else []}
        if self.isolation.cgroups:
            tenant = s.get(Tenant, job.tenant_id).name
            sandbox["limits"] = {"memory_mb": memory_for(s, job, tenant, nodes), "cpus": job.cpus_per_worker,
                                 "cpu_quota": self.isolation.cpu_quota,
                                 "pids": pids_for(s, job, tenant, self.isolation.pids)}
        return sandbox

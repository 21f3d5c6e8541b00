"""Settings: the one place that reads ``DEEPPOD_*`` environment variables."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from deeppod.contract import ENV_API_URL, ENV_CA_CERT, ENV_TOKEN, server_urls
from deeppod.errors import InvalidRequest

# 7447 is used by no common ML tool (Ray dashboard 8265, TensorBoard 6006, MLflow 5000,
# Jupyter 8888, Triton 8000-8002, TorchServe 8080/8081, Prometheus 9090).
DEFAULT_PORT = 7447
DEFAULT_HOME = "~/.deeppod"


def _int(env: dict, name: str, default: int | None) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(f"{name}={raw!r} is not an integer; set it to a whole number or unset it") from None


def _float(env: dict, name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise InvalidRequest(f"{name}={raw!r} is not a number; set it to a number of seconds or unset it") from None


def _bool(env: dict, name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
             "off": False}.get(raw.strip().lower())
    if value is None:
        raise InvalidRequest(f"{name}={raw!r} is not a yes/no value; set it to 1 or 0 (true/false) or unset it")
    return value


def _path(env: dict, name: str, default: Path | None) -> Path | None:
    raw = env.get(name)
    return Path(raw).expanduser().resolve() if raw else default


def _str(env: dict, name: str, default: str | None) -> str | None:
    return env.get(name) or default


# How a field's environment variable is read, by the field's type.
_READERS = {"bool": _bool, "int": _int, "int | None": _int, "float": _float, "Path": _path, "Path | None": _path,
            "str": _str, "str | None": _str}


def env_name(field_name: str) -> str:
    """Every setting has one variable: the field's name, upper case, after DEEPPOD_."""
    return "DEEPPOD_" + field_name.upper()


def installation_id(home: Path) -> str:
    """The installation's random id, kept in ``HOME/installation`` (the first server to start
    writes it; its failover partner reads it). A home that holds a database already and no
    id is an installation from before ids: its id is empty, and its names stay what they were."""
    import secrets

    path = home / "installation"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    home.mkdir(parents=True, exist_ok=True)
    made = "" if (home / "deeppod.db").exists() or (home / "jobs").exists() else secrets.token_hex(8)
    tmp = home / f".installation-{os.getpid()}"
    tmp.write_text(made + "\n")
    try:
        os.link(tmp, path)  # whole or not at all; another server of this home may have been first
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_text().strip()


@dataclass(frozen=True)
class Settings:
    """The server's settings. Each field is read from ``env_name(field)`` by ``from_env``;
    its default is written here once."""

    home: Path = field(default_factory=lambda: Path(DEFAULT_HOME).expanduser().resolve())
    database_url: str | None = None  # None: SQLite file under home
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    # the URL jobs, clients and the other servers of a failover control plane reach this one at;
    # empty: the listening address (a wildcard host: this machine's name)
    advertise_url: str = ""
    gpus: int | None = None  # logical GPU slots; None: probe NVML, else 0
    gpu_memory_mb: int | None = None  # each logical slot's memory (sizing a cluster on CPUs); None: not known
    cpus: int | None = None  # None: os.cpu_count()
    memory_mb: int | None = None  # None: physical memory
    grace_seconds: float = 30.0  # SIGTERM to SIGKILL, for jobs and serving replicas that do not say
    reconcile_interval: float = 0.5  # seconds between rounds of the job and deployment controllers
    # requests inside the API at once (0: what the database pool serves beside the control
    # loops, at most 3 per CPU: api/app.admission_slots); past it a request waits up to
    # api_queue_seconds, then gets 503 busy (api/admission.py)
    api_concurrency: int = 0
    api_queue_seconds: float = 2.0
    # where jobs run: "local" (this machine), "ray" (the Ray cluster at ray_address, HOST:PORT;
    # docs/cluster.md) or "slurm" (the Slurm cluster this host submits to); gpus_per_node:
    # logical GPU slots per Ray node without GPUs
    executor: str = "local"
    ray_address: str = ""
    gpus_per_node: int | None = None
    # on Slurm: the partition jobs go to ("": Slurm's default), the slurm.conf its commands read
    # ("": the host's), and the Python jobs' tasks run with and where they import deeppod from, on
    # the shared file system ("": the server's own)
    slurm_partition: str = ""
    slurm_conf: str = ""
    slurm_python: str = ""
    slurm_pythonpath: str = ""
    # the seconds of simulation one sizing request (console or API) may take before it answers
    # with the sizes tried so far ('deeppod size' on one's own machine has no limit)
    sizing_budget_seconds: float = 20.0
    max_body_bytes: int = 1 << 20
    log_level: str = "INFO"
    # scheduler
    aging_seconds: float = 600.0
    reserve_after_seconds: float = 300.0
    resize_after_seconds: float = 900.0
    # least attained service: the GPU-hours at which a job moves to the next service class,
    # comma-separated ("off": each tenant's jobs in arrival order, as before)
    las_gpu_hours: str = "2,32"
    # reclaim may move jobs that run within a guarantee to clear whole nodes for a gang (0: never)
    defragment: bool = True
    # warm spares kept per resizable elastic job below its largest size: processes with their
    # imports done, which an in-place grow turns into its new workers (runtime/spare.py); 0: none
    spare_workers: int = 2
    # datasets
    hot_dir: Path | None = None  # None: home/data/hot
    cold_dir: Path | None = None  # None: home/data/cold
    data_max_file_bytes: int = 256 << 20
    data_max_ingest_bytes: int = 64 << 30
    data_cold_after_seconds: float = 30 * 86400.0  # versions unused this long move to cold
    # jobs' code sent with them (jobs/code.py): one archive's limit, and what a tenant keeps
    code_max_bytes: int = 100 << 20
    code_tenant_bytes: int = 1 << 30
    # serving
    predict_max_bytes: int = 16 << 20  # one predict request's body, at the router and at each replica
    # finished jobs' folders are removed this many days after they ended (0: kept); stopped jobs keep theirs
    job_retention_days: float = 30.0
    housekeeping_interval: float = 60.0  # seconds between tiering and retention rounds
    audit_retention_days: float = 365.0  # audit events older than this are dropped (0: kept)
    # monitoring (monitor/): a sample of every GPU and the host each period; raw samples kept
    # monitor_raw_seconds, then minute averages until monitor_retention_days; a job under
    # monitor_idle_percent on all its GPUs for monitor_idle_seconds gets an "idle GPUs" event
    monitor_period: float = 5.0
    monitor_raw_seconds: float = 3600.0
    monitor_retention_days: float = 7.0
    monitor_idle_percent: float = 5.0
    monitor_idle_seconds: float = 1800.0
    # isolation (docs/security.md): "sandbox" (each tenant's jobs run as its own OS identity in
    # namespaces; needs root), "single-user" (jobs run as the server's identity; several tenants
    # allowed, each start says what is not isolated), "one-tenant" (the same, but a second
    # tenant is refused: nothing pretends to be isolated), or "auto": sandbox where possible,
    # else one-tenant
    isolation: str = "auto"
    # the kernel's limits on each sandboxed worker (executor/cgroups.py): processes and threads
    # (a plan's pids_per_worker or a job's own may lower it); "share": CPU time shared by weight
    # of --cpus-per-worker under contention, "quota": also a hard cap at that many CPUs
    pids_per_worker: int = 4096
    cpu_limit: str = "share"
    # start sandbox isolation even where the host's control groups cannot be used (memory is then
    # polled, processes and CPU not limited): the server refuses otherwise
    unenforced_limits: bool = False
    # jobs' own Python environments (envs/, --requirements): built under env_dir (default
    # HOME/envs; a node-local folder on a cluster), from the package index these name (empty:
    # the installer's default, PyPI), at most env_cache_gb kept (least recently used go first)
    env_dir: Path | None = None
    env_index_url: str = ""
    env_extra_index_url: str = ""
    env_find_links: str = ""
    env_no_index: bool = False
    env_cache_gb: float = 50.0
    # container images jobs may run in (--image NAME): NAME.tar / .tar.gz archives that
    # 'podman save', 'docker save' or 'podman export' wrote, put here by the administrator;
    # unpacked once per node under env_dir/images (envs/images.py). Unset: no images
    image_dir: str | None = None
    # run sandboxed jobs on a Ray cluster that does not ask for Ray's token (docs/cluster.md)
    ray_without_auth: bool = False
    # the network a sandboxed job gets unless it says (--network): "host", "isolated" (its own
    # namespace; only the API reachable) or "none" (executor/netns.py, docs/security.md)
    job_network: str = "host"
    # seconds between measurements of tenants' job folders against the plan's storage quotas
    storage_interval: float = 30.0
    # notebooks (notebooks/): stopped after this long without kernel or terminal activity unless
    # the plan or the notebook says less; how often their activity is read
    notebook_idle_seconds: float = 7200.0
    notebook_idle_interval: float = 30.0
    # where a tenant's jobs may work (sandbox isolation), os.pathsep-separated, {tenant} is the
    # tenant's name; empty: HOME/work/{tenant}
    work_roots: str = ""
    # TLS: a PEM certificate and key (or tls_cert "self-signed": made once in HOME/tls), and the
    # CA file clients and jobs should trust when it is not a public CA (self-signed: the cert)
    secret_key: str = ""  # seals jobs' --env values at rest; empty: HOME/secret.key (made on first start)
    # the S3 endpoint's virtual-host-style domain: a request to BUCKET.<s3_domain> names its bucket
    # in the host (a wildcard DNS name for it is the administrator's); empty: path-style only
    s3_domain: str = ""
    # the S3 endpoint also at the root of a port of its own (clients that take a host, not a
    # URL: MinIO's SDK, mc); None: only at /s3 of the API's port
    s3_port: int | None = None
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""

    @property
    def las_thresholds(self) -> tuple[float, ...]:
        """DEEPPOD_LAS_GPU_HOURS as the scheduler's thresholds, in GPU-seconds."""
        if self.las_gpu_hours.strip().lower() == "off":
            return ()
        try:
            hours = [float(x) for x in self.las_gpu_hours.split(",") if x.strip()]
        except ValueError:
            raise InvalidRequest(f"DEEPPOD_LAS_GPU_HOURS={self.las_gpu_hours!r}: give increasing GPU-hours, "
                                 "comma-separated (e.g. 2,32), or off") from None
        if any(h <= 0 for h in hours) or hours != sorted(set(hours)):
            raise InvalidRequest(f"DEEPPOD_LAS_GPU_HOURS={self.las_gpu_hours!r}: the GPU-hours must be positive "
                                 "and increasing (e.g. 2,32)")
        return tuple(h * 3600.0 for h in hours)

    @property
    def instance(self) -> str:
        """What this installation's names on a shared host begin with (tenants' OS users, shm, Ray's
        namespace): from the home's path and installation id, so one plane's servers agree and two
        installations, or a home made again, never collide."""
        import hashlib

        seed = str(Path(self.home).resolve()) + installation_id(Path(self.home))
        return hashlib.sha256(seed.encode()).hexdigest()[:8]

    @property
    def hot_root(self) -> Path:
        return self.hot_dir or self.home / "data" / "hot"

    @property
    def cold_root(self) -> Path:
        return self.cold_dir or self.home / "data" / "cold"

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"

    @property
    def envs_root(self) -> Path:
        return self.env_dir or self.home / "envs"

    @property
    def env_index(self) -> dict:
        """The package index settings every build uses (part of an environment's key)."""
        return {k: v for k, v in (("index_url", self.env_index_url), ("extra_index_url", self.env_extra_index_url),
                                  ("find_links", self.env_find_links), ("no_index", self.env_no_index)) if v}

    @property
    def code_dir(self) -> Path:
        return self.home / "code"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def experiments_dir(self) -> Path:
        return self.home / "experiments"

    def tenant_roots(self) -> list[str]:
        """The work-root templates, each with a {tenant} placeholder."""
        given = [r for r in self.work_roots.split(os.pathsep) if r]
        return given or [str(self.home / "work" / "{tenant}")]

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'deeppod.db'}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def public_url(self) -> str:
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        if self.host in ("0.0.0.0", "::", ""):
            return f"{self.scheme}://{socket.gethostname()}:{self.port}"
        return self.url

    def with_overrides(self, **kw) -> Settings:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    @classmethod
    def from_env(cls, env: dict | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        defaults = cls()
        return cls(**{f.name: _READERS[f.type](env, env_name(f.name), getattr(defaults, f.name)) for f in fields(cls)})


def default(name: str):
    """A setting's default, for code outside the server that takes the same value (a replica)."""
    return getattr(Settings(), name)


SERVER_FILE = "server.json"  # in DEEPPOD_HOME while a server runs: {"url", "pid"}
LOCAL_SERVERS = "servers"  # beside the login config: one file per server home, {"home", "url", "pid", "ca_cert"}


def client_config_path(env: dict | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("DEEPPOD_CONFIG") or "~/.config/deeppod/config.json").expanduser()


def local_server_record(home: Path, env: dict | None = None) -> Path:
    """The file through which the CLI of this user finds the server of ``home``, whatever its port."""
    import hashlib

    key = hashlib.sha256(str(Path(home).expanduser().resolve()).encode()).hexdigest()[:16]
    return client_config_path(env).parent / LOCAL_SERVERS / f"{key}.json"


@dataclass(frozen=True)
class ClientSettings:
    """Where the SDK and CLI find the server: flags, then env, then the login config
    (``deeppod login URL``), then a server running on this machine: the one in DEEPPOD_HOME
    (or the default home), else the one server this user runs; several and none chosen is an
    error that lists them (never another installation's server picked silently). The token: a
    local server's admin token, from its home, when its URL is the one used."""

    url: str
    token: str | None
    s3_endpoint: str | None = None  # for s3:// ingest sources: DEEPPOD_S3_ENDPOINT, else AWS_ENDPOINT_URL
    ca_cert: str | None = None  # verify an https server with this CA file (DEEPPOD_CA_CERT); None: system trust

    @classmethod
    def resolve(cls, url: str | None = None, token: str | None = None, env: dict | None = None, *,
                ca_cert: str | None = None) -> ClientSettings:
        import json

        env = dict(os.environ if env is None else env)
        url = url or env.get(ENV_API_URL)
        token = token or env.get(ENV_TOKEN)
        ca = ca_cert or env.get(ENV_CA_CERT) or None
        path = client_config_path(env)
        if (url is None or token is None or ca is None) and path.exists():
            try:
                saved = json.loads(path.read_text())
            except ValueError:
                raise InvalidRequest(f"{path} is not valid JSON; run 'deeppod login' again or delete it") from None
            if url is None or url.rstrip("/") == saved.get("url"):  # its token and CA belong to its URL
                ca, token = ca or saved.get("ca_cert"), token or saved.get("token")
            url = url or saved.get("url")
        local = _local_server(env, url)
        if local is not None:
            url, ca = url or local["url"], ca or local.get("ca_cert")
        # none found running, no URL: the local default port, with the home's admin token
        admin = Path(local["home"] if local else env.get("DEEPPOD_HOME") or DEFAULT_HOME).expanduser() / "admin.token"
        if token is None and (local is not None or url is None) and admin.exists():
            token = admin.read_text().strip() or None
        url = (",".join(server_urls(url)) or ("DEEPPOD_PORT" not in env and _last_url(env))
               or f"http://127.0.0.1:{_int(env, 'DEEPPOD_PORT', DEFAULT_PORT)}")
        return cls(url=url,
                   token=token, s3_endpoint=env.get("DEEPPOD_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL") or None,
                   ca_cert=ca)


def _running(path: Path) -> dict | None:
    """The record in ``path`` if the server that wrote it still runs (a file left by a server
    that died says nothing)."""
    import json

    try:
        doc = json.loads(path.read_text())
        os.kill(int(doc["pid"]), 0)
    except PermissionError:
        return doc
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return doc if isinstance(doc, dict) and doc.get("url") else None


def local_servers(env: dict | None = None) -> list[dict]:
    """The servers this user runs on this machine (each {"home", "url", "pid", "ca_cert"})."""
    folder = client_config_path(env).parent / LOCAL_SERVERS
    found = [_running(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return [d for d in found if d is not None and d.get("home")]


def _local_server(env: dict, url: str | None) -> dict | None:
    """The server on this machine that ``url`` names (for its CA and admin token); with no URL,
    the one to use: DEEPPOD_HOME's (or the default home's), else this user's only one."""
    home = Path(env.get("DEEPPOD_HOME") or DEFAULT_HOME).expanduser()
    here = _running(home / SERVER_FILE)
    if here is not None:
        here = {**here, "home": str(home)}
    if url is not None:
        wanted = set(server_urls(url))
        return next((d for d in [here, *local_servers(env)] if d is not None and d["url"] in wanted), None)
    if here is not None or env.get("DEEPPOD_HOME"):
        return here
    mine = local_servers(env)
    if len(mine) > 1:
        listed = "; ".join(f"{d['url']} (home {d['home']})" for d in mine)
        raise InvalidRequest(f"{len(mine)} DeepPod servers run on this machine and none is chosen: {listed}. "
                             "Pick one: 'deeppod login URL' (kept for later commands), --url URL, or "
                             "DEEPPOD_HOME=HOME")
    return mine[0] if mine else None


def _last_url(env: dict) -> str | None:
    """The URL the server of DEEPPOD_HOME (or the default home) last used, running or not: with
    none running, the CLI names the port it last used, not the default one. Without
    DEEPPOD_HOME and with none there, that of this user's only server."""
    import json

    home = Path(env.get("DEEPPOD_HOME") or DEFAULT_HOME)
    records = [local_server_record(home, env)]
    if not env.get("DEEPPOD_HOME") and not records[0].exists():
        records = sorted((client_config_path(env).parent / LOCAL_SERVERS).glob("*.json"))
    try:
        return str(json.loads(records[0].read_text())["url"]) if len(records) == 1 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None

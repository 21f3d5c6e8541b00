"""``deeppod.Client``: the Python SDK over the REST API (the CLI uses it too)."""

from __future__ import annotations

import logging
import os
import random
import time

import httpx

from deeppod import job_spec
from deeppod.contract import server_urls, tls_context
from deeppod.errors import DeepPodError, InvalidRequest, from_response
from deeppod.sdk.resources import (
    FLAT,
    RESOURCES,
    Datasets,
    Deployments,
    Experiments,
    Jobs,
    Models,
    Nodes,
    Servers,
    Tenants,
    Tokens,
    Users,
)
from deeppod.settings import ClientSettings

BUSY_RETRIES = 6  # a busy server (503 busy) is asked again, waiting Retry-After, doubled each time
BUSY_MAX_WAIT_S = 8.0


def _busy(r: httpx.Response) -> bool:
    if r.status_code != 503:
        return False
    try:
        return r.json()["error"]["code"] == "busy"
    except (ValueError, KeyError, TypeError):
        return False


def _retry_after(r: httpx.Response) -> float:
    try:
        return max(0.1, float(r.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0


def requirements_text(requirements: str | os.PathLike | list[str] | None) -> str | None:
    """A job's requirements as the API takes them: a requirements file's path, its text, or a
    list of requirements."""
    if requirements is None:
        return None
    if isinstance(requirements, (list, tuple)):
        return "\n".join(requirements)
    if isinstance(requirements, os.PathLike) or ("\n" not in requirements and os.path.isfile(requirements)):
        with open(requirements) as f:
            return f.read()
    return requirements


class Client:
    """Talks to a DeepPod server.

    ``Client()`` finds the server and token from ``DEEPPOD_API_URL`` / ``DEEPPOD_TOKEN``,
    the config file ``deeppod login`` writes, or a local server's admin token.

    Each resource is an attribute named as the API names it (sdk/resources.py): calling it
    lists, its methods act on it: ``client.jobs()``, ``client.jobs.stop(7)``,
    ``client.experiments.stop("lr-search")``. The flat names of before (``client.stop``) stay
    as aliases for one release (resources.FLAT).
    """

    jobs: Jobs
    datasets: Datasets
    experiments: Experiments
    models: Models
    deployments: Deployments
    nodes: Nodes
    servers: Servers
    tenants: Tenants
    users: Users
    tokens: Tokens

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 ca_cert: str | None = None):
        """``ca_cert``: verify an https server with this CA file (else DEEPPOD_CA_CERT, the login
        config, a local server's own, or the system's trust store)."""
        cfg = ClientSettings.resolve(url, token, ca_cert=ca_cert)
        # several servers (a failover control plane, "URL1,URL2"): the first that answers
        self.urls = server_urls(cfg.url)
        self.url = self.urls[0]
        self.token = cfg.token
        self.s3_endpoint = cfg.s3_endpoint
        self.ca_cert = cfg.ca_cert
        self._timeout = timeout
        self._http = self._connect(self.url)
        for name, resource in RESOURCES.items():  # client.jobs, client.experiments, ... (sdk/resources.py)
            setattr(self, name, resource(self))

    def _connect(self, url: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        # https: verified, against the server's CA file when one is given (self-signed, private CA)
        return httpx.Client(base_url=url, headers=headers, timeout=self._timeout,
                            verify=tls_context(url, self.ca_cert) or True)

    def _use(self, url: str) -> None:
        if url != self.url:
            self._http.close()
            self.url, self._http = url, self._connect(url)

    def _send(self, send, *, replayable: bool):
        """``send(http)`` on the server in use; if it does not take the connection (or, for a
        request that may be repeated, drops it), on the next server named. Returns what
        ``send`` returns."""
        tried = []
        start = self.urls.index(self.url)
        for url in self.urls[start:] + self.urls[:start]:
            self._use(url)
            try:
                return send(self._http)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                tried.append(f"{url} ({exc})")
            except httpx.TransportError as exc:
                if not replayable:
                    raise DeepPodError(f"lost the connection to {url} during the request ({exc}); check whether it "
                                       "took effect before repeating it", code="unreachable") from None
                tried.append(f"{url} ({exc})")
        raise DeepPodError(f"cannot reach the DeepPod server at {'; '.join(tried)}; is it running? "
                           "Start it with 'deeppod server' or pass --url", code="unreachable")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw):
        r = self._send(lambda http: http.request(method, path, **kw), replayable=method in ("GET", "HEAD"))
        for attempt in range(BUSY_RETRIES):  # the server did nothing with it: any request may be sent again
            if not _busy(r):
                break
            time.sleep(min(BUSY_MAX_WAIT_S, _retry_after(r) * 2 ** attempt) * random.uniform(0.5, 1.0))
            r = self._send(lambda http: http.request(method, path, **kw), replayable=method in ("GET", "HEAD"))
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = r.text
            raise from_response(r.status_code, body)
        return r.json() if r.content else None

    # datasets

    def commit(self, name: str) -> dict:
        """The files in the dataset's S3 inbox become its next version; the dataset after it."""
        return self._request("POST", f"/v1/datasets/{name}/commit")

    # monitoring

    # hyperparameter search

    # models

    # deployments

    # identity
    def whoami(self) -> dict:
        return self._request("GET", "/v1/whoami")

    # jobs

    def job_body(self, command: list[str], *, code: str | os.PathLike | None = None, own_folder: bool = False,
                 requirements: str | os.PathLike | list[str] | None = None, **options) -> dict:
        """The body of POST /v1/jobs (and of a search's trial template): sends the code first when
        there is code to send. Arguments as :meth:`submit`."""
        workdir = options.pop("workdir", None)
        if (workdir is not None) + (code is not None) + own_folder > 1:
            raise InvalidRequest("give one of workdir (a folder on the server), code (a folder sent with the "
                                 "job) or own_folder")
        if workdir is None and code is None and not own_folder:
            here = os.getcwd()
            workdir, code = (here, None) if self.runs_in_place(here) else (None, here)
        for name in ("env", "stop_rules", "datasets", "models"):  # None, as a caller may pass it: the empty default
            if options.get(name, 0) is None:
                del options[name]
        spec = job_spec.build(command=list(command), requirements=requirements_text(requirements),
                              workdir=os.path.abspath(workdir) if workdir is not None else None, **options)
        if code is not None:  # checked first: no code is sent for a job with a wrong option
            spec.code = self.send_code(code)
        return spec.body()

    def runs_in_place(self, folder: str) -> bool:
        """Whether a job submitted from ``folder`` may run there on the server: yes unless the
        server sandboxes jobs and ``folder`` is outside your tenant's work roots."""
        me = self.whoami()
        roots = me.get("work_roots")
        if me.get("isolation") != "sandbox" or roots is None:
            return True
        real = os.path.realpath(folder)
        return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)

    def send_code(self, folder: str | os.PathLike) -> str:
        """Send ``folder`` (packed: deeppod.sdk.code) to the server; its digest, for ``submit``."""
        from deeppod.sdk.code import pack

        packed = pack(folder)
        if packed.left_out:
            logging.getLogger(__name__).warning(
                "%d symbolic link(s) in %s point outside it and were not sent with the job", packed.left_out, folder)
        self._request("PUT", f"/v1/code/{packed.digest}", content=packed.data,
                      headers={"content-type": "application/octet-stream"}, timeout=None)
        return packed.digest

    # tenants, users, tokens, nodes

    def size(self, *, images: int, epochs: float, hours: float, images_per_gpu: float, **workload) -> dict:
        """A cluster's size for a workload (administrators and tenant administrators): GPUs,
        nodes, cores per GPU, storage throughput and capacity, the simulated waits and why.
        The other fields are ``deeppod size``'s (users, runs_per_user_day, wait_minutes,
        job_gpus, inference_rps, rps_per_gpu, gpus_per_node, image_kb, versions, simulate)."""
        return self._request("POST", "/v1/sizing", json={"images": images, "epochs": epochs, "hours": hours,
                                                         "images_per_gpu": images_per_gpu, **workload})

    def create_access_key(self, name: str = "", scope: str = "write", expires_in: float | None = None) -> dict:
        """An S3 access key for you: ``key_id``, ``secret`` (shown once) and the ``endpoint`` URL."""
        return self._request("POST", "/v1/access-keys", json={"name": name, "scope": scope, "expires_in": expires_in})

    def access_keys(self) -> list[dict]:
        return self._request("GET", "/v1/access-keys")

    def revoke_access_key(self, key_id: str) -> None:
        self._request("DELETE", f"/v1/access-keys/{key_id}")

    def audit(self, *, user: str | None = None, since: str | None = None, failed: bool = False,
              path: str | None = None, limit: int = 200) -> list[dict]:
        """The audit log, newest first (administrators). ``since``: an ISO 8601 time."""
        params = {k: v for k, v in {"user": user, "since": since, "failed": failed or None, "path": path,
                                    "limit": limit}.items() if v is not None}
        return self._request("GET", "/v1/audit", params=params)

    def plan(self) -> dict:
        """The resource plan in force and, per tenant, guaranteed / in use / borrowed / lent / waiting."""
        return self._request("GET", "/v1/plan")

    def apply_plan(self, plan: dict) -> dict:
        return self._request("PUT", "/v1/plan", json=plan)

    # jobs' Python environments
    def envs(self) -> list[dict]:
        """Your tenant's built environments (an admin: every tenant's): size, last use, active jobs."""
        return self._request("GET", "/v1/envs")

    def images(self) -> list[dict]:
        """The container images this server offers (``submit(image=NAME)``), and whether each is unpacked."""
        return self._request("GET", "/v1/images")

    def remove_env(self, key: str) -> dict:
        return self._request("DELETE", f"/v1/envs/{key}")

    def prune_envs(self, keep_bytes: int = 0) -> list[str]:
        """(Admins) remove least recently used environments not in use until the cache takes at most ``keep_bytes``."""
        return self._request("POST", "/v1/envs/prune", json={"keep_bytes": keep_bytes})["removed"]





def _alias(noun: str, verb: str):
    def flat(self, *args, **kwargs):
        return getattr(getattr(self, noun), verb)(*args, **kwargs)

    method = getattr(RESOURCES[noun], verb)
    flat.__name__, flat.__doc__ = method.__name__, f"The same as ``client.{noun}.{verb}`` (an alias for one release)."
    return flat


for _flat, (_noun, _verb) in FLAT.items():  # client.stop(7) is client.jobs.stop(7), for one release
    setattr(Client, _flat, _alias(_noun, _verb))

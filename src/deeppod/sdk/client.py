"""``deeppod.Client``: the Python SDK over the REST API (the CLI uses it too)."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Iterator

import httpx

from deeppod import job_spec
from deeppod.contract import FINAL_STATES, server_urls, tls_context
from deeppod.errors import DeepPodError, InvalidRequest, from_response
from deeppod.sdk.resources import Resource, resources
from deeppod.settings import ClientSettings
from deeppod.states import DeploymentState

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
    ``client.experiments.stop("lr-search")``. The flat methods below stay as aliases.
    """

    jobs: Resource
    datasets: Resource
    experiments: Resource
    models: Resource
    deployments: Resource
    nodes: Resource
    servers: Resource
    tenants: Resource
    users: Resource
    tokens: Resource

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
        for name, resource in _RESOURCES.items():  # client.jobs, client.experiments, ... (sdk/resources.py)
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
    def ingest(self, name: str, source: str, *, policy: dict | None = None, tags: dict | None = None,
               description: str | None = None, progress=None, s3_endpoint: str | None = None,
               s3_key_id: str | None = None, s3_secret: str | None = None) -> dict:
        """Ingest a folder, an archive or ``s3://bucket/prefix`` as the next version of ``name``.
        ``progress(files_done, files_total, bytes_done, bytes_total)`` is called as it uploads."""
        import json

        from deeppod.sdk.sources import open_source

        src = open_source(source, s3_endpoint=s3_endpoint or self.s3_endpoint, s3_key_id=s3_key_id, s3_secret=s3_secret)
        params = {"source": src.description}
        if policy:
            params["policy"] = json.dumps(policy)
        if tags:
            params["tags"] = json.dumps(tags)
        if description is not None:
            params["description"] = description
        return self._request("POST", f"/v1/datasets/{name}/versions", params=params, content=src.chunks(progress),
                             headers={"content-type": src.content_type, "content-length": str(src.length)},
                             timeout=None)

    def _list_datasets(self, query: str = "") -> list[dict]:
        return self._request("GET", "/v1/datasets", params={"q": query} if query else None)

    def commit(self, name: str) -> dict:
        """The files in the dataset's S3 inbox become its next version; the dataset after it."""
        return self._request("POST", f"/v1/datasets/{name}/commit")

    def dataset(self, ref: str) -> dict:
        return self._request("GET", f"/v1/datasets/{ref}")

    def update_dataset(self, name: str, **changes) -> dict:
        return self._request("PATCH", f"/v1/datasets/{name}", json=changes)

    def set_data_policy(self, name: str, policy: dict, replace: bool = False) -> dict:
        return self._request("PUT", f"/v1/datasets/{name}/policy", json={"policy": policy, "replace": replace})

    def remove_dataset_version(self, ref: str) -> dict:
        """Delete NAME@VERSION and the stored images no other version names."""
        return self._request("DELETE", f"/v1/datasets/{ref}")

    def stage(self, ref: str, tier: str = "hot") -> dict:
        return self._request("POST", f"/v1/datasets/{ref}/stage", params={"tier": tier}, timeout=None)

    def manifest(self, ref: str) -> list[dict]:
        import json

        r = self._send(lambda http: http.get(f"/v1/datasets/{ref}/manifest"), replayable=True)
        if r.status_code >= 400:
            raise from_response(r.status_code, r.json())
        return [json.loads(line) for line in r.text.splitlines() if line]

    # monitoring
    def job_gpus(self, job_id: int, since: float | None = None) -> dict:
        """The job's GPU utilization and memory over time, and its recent mean."""
        return self._request("GET", f"/v1/jobs/{job_id}/gpus", params={"since": since} if since else None)

    def job_usage(self, job_id: int, since: float | None = None) -> dict:
        """What the job used over time: its GPUs, CPU in cores and its processes' resident memory."""
        return self._request("GET", f"/v1/jobs/{job_id}/usage", params={"since": since} if since else None)

    def gpus(self) -> list[dict]:
        """Each GPU's newest sample (another tenant's job shows as busy only)."""
        return self._request("GET", "/v1/monitor/gpus")

    def hosts(self) -> list[dict]:
        return self._request("GET", "/v1/monitor/hosts")

    def burst(self) -> dict:
        """Burst node types (nodes up and asked for), each tenant's burst cost, and the budgets."""
        return self._request("GET", "/v1/burst")

    # hyperparameter search
    def create_experiment(self, name: str, command: list[str], *, space: dict, metric: str, mode: str = "max",
                          trials: int = 20, parallel: int = 4, sampler: str = "tpe", pruner: str = "asha",
                          prune_after: int = 1, seed: int | None = None, register: str | None = None,
                          register_at_chance: bool = False,
                          reuse: bool = False, **job) -> dict:
        """A search whose trials run ``command`` ({param} placeholders, DEEPPOD_PARAM_<NAME>) as
        jobs; ``job`` takes :meth:`submit`'s arguments (workers, gpus_per_worker, datasets, ...).
        ``reuse``: a trial's process runs the next trial when the script loops over
        ``runtime.trials()`` (torch imported and data loaded once). ``prune_after``: the first
        reported step at which the pruner may stop a trial."""
        return self._request("POST", "/v1/experiments", json={
            "name": name, "space": space, "metric": metric, "mode": mode, "trials": trials, "parallel": parallel,
            "sampler": sampler, "pruner": pruner, "prune_after": prune_after, "seed": seed, "register": register,
            "register_at_chance": register_at_chance, "reuse": reuse, "job": self.job_body(command, **job)})

    def _list_experiments(self) -> list[dict]:
        return self._request("GET", "/v1/experiments")

    def experiment(self, name: str, tenant: str | None = None) -> dict:
        return self._request("GET", f"/v1/experiments/{name}", params={"tenant": tenant} if tenant else None)

    def stop_experiment(self, name: str) -> dict:
        return self._request("POST", f"/v1/experiments/{name}/stop")

    def resume_experiment(self, name: str) -> dict:
        return self._request("POST", f"/v1/experiments/{name}/resume")

    # models
    def register_model(self, name: str, *, job_id: int | None = None, path: str | None = None,
                       description: str | None = None, aliases: list[str] | None = None) -> dict:
        """A new version of model ``name`` from a job's artifact (JOB_DIR/model) or a server folder."""
        return self._request("POST", f"/v1/models/{name}/versions", json={
            "job_id": job_id, "path": path, "description": description, "aliases": aliases or []})

    def _list_models(self) -> list[dict]:
        return self._request("GET", "/v1/models")

    def model(self, name: str) -> dict:
        return self._request("GET", f"/v1/models/{name}")

    def model_version(self, ref: str) -> dict:
        """NAME@VERSION or NAME@ALIAS."""
        return self._request("GET", f"/v1/models/{ref}/version")

    def remove_model(self, ref: str) -> list[int]:
        """NAME@VERSION removes one version, NAME the whole model; returns the versions removed."""
        return self._request("DELETE", f"/v1/models/{ref}")["removed"]

    def set_alias(self, name: str, alias: str, version: str | int | None) -> dict:
        """Point ``alias`` at a version (None removes it)."""
        return self._request("PUT", f"/v1/models/{name}/aliases/{alias}",
                             json={"version": None if version is None else str(version)})

    def compare(self, name: str, a: str | int, b: str | int, data: str) -> dict:
        """Start a comparison job; poll :meth:`comparison` (or ``wait=True`` in :meth:`compare_and_wait`)."""
        return self._request("POST", f"/v1/models/{name}/comparisons", json={"a": str(a), "b": str(b), "data": data})

    def comparison(self, name: str, job_id: int) -> dict:
        return self._request("GET", f"/v1/models/{name}/comparisons/{job_id}")

    def compare_and_wait(self, name: str, a: str | int, b: str | int, data: str, timeout: float = 1800.0) -> dict:
        job = self.compare(name, a, b, data)
        self.wait(job["job_id"], timeout=timeout)
        return self.comparison(name, job["job_id"])

    def promote(self, name: str, version: str | int, *, force: bool = False) -> dict:
        return self._request("POST", f"/v1/models/{name}/promote", json={"version": str(version), "force": force})

    # deployments
    def deploy(self, model: str, *, name: str | None = None, replicas: int = 1, gpus_per_replica: int = 0,
               cpus_per_replica: float = 1.0, max_batch: int = 32, max_wait_ms: float = 5.0) -> dict:
        return self._request("POST", "/v1/deployments", json={
            "model": model, "name": name, "replicas": replicas, "gpus_per_replica": gpus_per_replica,
            "cpus_per_replica": cpus_per_replica, "max_batch": max_batch, "max_wait_ms": max_wait_ms})

    def _list_deployments(self) -> list[dict]:
        return self._request("GET", "/v1/deployments")

    def deployment(self, name: str) -> dict:
        return self._request("GET", f"/v1/deployments/{name}", headers={"accept": "application/json"})

    def update_deployment(self, name: str, *, version: str | int | None = None, replicas: int | None = None,
                          max_batch: int | None = None, max_wait_ms: float | None = None) -> dict:
        return self._request("PATCH", f"/v1/deployments/{name}", json={
            "version": None if version is None else str(version), "replicas": replicas, "max_batch": max_batch,
            "max_wait_ms": max_wait_ms})

    def rollback(self, name: str) -> dict:
        return self._request("POST", f"/v1/deployments/{name}/rollback")

    def delete_deployment(self, name: str) -> None:
        self._request("DELETE", f"/v1/deployments/{name}")

    def create_deployment_key(self, name: str, label: str = "") -> dict:
        return self._request("POST", f"/v1/deployments/{name}/keys", json={"name": label})

    def deployment_keys(self, name: str) -> list[dict]:
        return self._request("GET", f"/v1/deployments/{name}/keys")

    def revoke_deployment_key(self, name: str, key_id: int) -> dict:
        return self._request("DELETE", f"/v1/deployments/{name}/keys/{key_id}")

    def wait_deployment(self, name: str, *, version: int | None = None, timeout: float = 300.0,
                        poll: float = 0.5) -> dict:
        """Until every replica is healthy (on ``version`` when given) and nothing old is left."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            d = self.deployment(name)
            if d["state"] == DeploymentState.READY and (version is None or d["version"] == version):
                return d
            if d["state"] == DeploymentState.FAILED:
                raise DeepPodError(f"deployment {name} failed: {d['reason']}", code="deployment_failed")
            if time.monotonic() > deadline:
                raise DeepPodError(f"deployment {name} is still {d['state']} after {timeout:g} s: {d['reason']}",
                                   code="timeout")
            time.sleep(poll)

    def predict(self, name: str, images: list[bytes] | None = None, *, tensors: list | None = None,
                top_k: int = 5) -> dict:
        """Images (encoded bytes) go as multipart uploads; tensors as JSON."""
        from deeppod.sdk.direct import predict_body

        return self._request("POST", f"/v1/deployments/{name}/predict", **predict_body(images, tensors, top_k))

    def direct_token(self, name: str, *, ttl: float = 600.0) -> dict:
        """A token to call the deployment's replicas directly, and where they are (the API's
        ``POST /v1/deployments/NAME/direct``)."""
        return self._request("POST", f"/v1/deployments/{name}/direct", json={"ttl_seconds": ttl})

    def revoke_direct(self, name: str) -> dict:
        return self._request("DELETE", f"/v1/deployments/{name}/direct")

    def direct(self, name: str, *, ttl: float = 600.0):
        """A :class:`~deeppod.sdk.direct.DirectPredictor`: ``.predict(...)`` as :meth:`predict`
        takes it, sent to the replicas past the control plane."""
        from deeppod.sdk.direct import DirectPredictor

        return DirectPredictor(self, name, ttl=ttl)

    # identity
    def whoami(self) -> dict:
        return self._request("GET", "/v1/whoami")

    # jobs
    def submit(self, command: list[str], *, code: str | os.PathLike | None = None, own_folder: bool = False,
               requirements: str | os.PathLike | list[str] | None = None, **options) -> dict:
        """Submit a job. ``options`` are the fields of :class:`deeppod.JobSpec` (``workers``,
        ``gpus_per_worker``, ``datasets``...: each with its default and bounds there). ``workers``
        start together; ``max_workers`` makes it elastic. Each of ``datasets`` (NAME[@VERSION]) is
        staged hot first; workers find it in DEEPPOD_DATA_<NAME>.

        Where it runs: ``workdir``, a folder on the server; or ``code``, a folder here that is
        sent with the job (it runs in its own copy); or ``own_folder``, an empty folder of the
        job's own (for a command that needs no files). None of them: the current folder, in
        place when the server may run your jobs there, else sent as ``code``.

        Its software: the platform's Python environment; or ``requirements`` (a file, its text
        or its lines; and ``python``), a Python environment built for it; or ``image``, a
        container image the server offers (:meth:`images`)."""
        return self._request("POST", "/v1/jobs", json=self.job_body(
            command, code=code, own_folder=own_folder, requirements=requirements, **options))

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
        for name in ("env", "stop_rules", "datasets"):  # None, as a caller may pass it: the empty default
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

    def _list_jobs(self, state: str | None = None, limit: int = 200, *, kind: str | None = None,
             exclude_kind: str | None = None, tenant: str | None = None, user: str | None = None,
             name: str | None = None) -> list[dict]:
        """Newest first. ``kind``/``exclude_kind``: comma-separated batch, serve, evaluate, trial;
        ``name``: a part of the job's name."""
        given = {"state": state, "kind": kind, "exclude_kind": exclude_kind, "tenant": tenant, "user": user,
                 "name": name}
        params = {"limit": limit, **{k: v for k, v in given.items() if v}}
        return self._request("GET", "/v1/jobs", params=params)

    def job(self, job_id: int) -> dict:
        return self._request("GET", f"/v1/jobs/{job_id}")

    def remove_job_files(self, job_id: int, *, force: bool = False) -> dict:
        """Remove a finished job's folder (logs, checkpoints, outputs); its record stays."""
        return self._request("DELETE", f"/v1/jobs/{job_id}/files", params={"force": force})

    def purge_jobs(self, older_than_seconds: float) -> dict:
        """Remove the folders of finished jobs that ended longer ago (stopped jobs keep theirs)."""
        return self._request("POST", "/v1/jobs/purge", json={"older_than_seconds": older_than_seconds})

    def job_spec(self, job_id: int) -> dict:
        """A batch job's submit options: ``fields`` (a mapping) and ``yaml`` (a file that
        ``deeppod submit --spec`` submits again)."""
        return self._request("GET", f"/v1/jobs/{job_id}/spec")

    def events(self, job_id: int) -> list[dict]:
        return self._request("GET", f"/v1/jobs/{job_id}/events")

    def cancel(self, job_id: int) -> dict:
        return self._request("POST", f"/v1/jobs/{job_id}/cancel")

    def stop(self, job_id: int) -> dict:
        """Graceful stop: the job checkpoints on SIGTERM and ends as ``stopped``."""
        return self._request("POST", f"/v1/jobs/{job_id}/stop")

    def resume(self, job_id: int) -> dict:
        """Queue a stopped job again; it continues from its checkpoint with the same id."""
        return self._request("POST", f"/v1/jobs/{job_id}/resume")

    def metrics(self, job_id: int, names: list[str] | None = None, max_points: int = 500) -> dict:
        params = {"max_points": max_points, **({"names": ",".join(names)} if names else {})}
        return self._request("GET", f"/v1/jobs/{job_id}/metrics", params=params)

    def histograms(self, job_id: int, name: str | None = None, max_steps: int = 50) -> list[dict]:
        params = {"max_steps": max_steps, **({"name": name} if name else {})}
        return self._request("GET", f"/v1/jobs/{job_id}/histograms", params=params)

    def logs(self, job_id: int, *, rank: int | None = None, follow: bool = False) -> Iterator[bytes]:
        params = {"follow": follow, **({"rank": rank} if rank is not None else {})}
        r = self._send(lambda http: http.send(http.build_request("GET", f"/v1/jobs/{job_id}/logs", params=params,
                                                                 timeout=None), stream=True), replayable=True)
        try:
            if r.status_code >= 400:
                r.read()
                raise from_response(r.status_code, r.json())
            yield from r.iter_bytes()
        except httpx.TransportError as exc:
            raise DeepPodError(f"lost the log stream from {self.url} ({exc})", code="unreachable") from None
        finally:
            r.close()

    def wait(self, job_id: int, timeout: float = 600.0, poll: float = 0.5) -> dict:
        """Block until the job ends; returns it."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["state"] in FINAL_STATES:
                return job
            if time.monotonic() > deadline:
                raise DeepPodError(f"job {job_id} still {job['state']} after {timeout:g} s", code="timeout")
            time.sleep(poll)

    # tenants, users, tokens, nodes
    def create_tenant(self, name: str) -> dict:
        return self._request("POST", "/v1/tenants", json={"name": name})

    def _list_tenants(self) -> list[dict]:
        return self._request("GET", "/v1/tenants")

    def create_user(self, name: str, tenant: str, admin: bool = False, role: str = "member") -> dict:
        """``role``: admin, tenant-admin, member or viewer (``admin=True`` is role admin)."""
        return self._request("POST", "/v1/users", json={"name": name, "tenant": tenant, "admin": admin, "role": role})

    def set_role(self, name: str, role: str) -> dict:
        """Change a user's role: admin, tenant-admin, member or viewer."""
        return self._request("PATCH", f"/v1/users/{name}", json={"role": role})

    def _list_users(self) -> list[dict]:
        return self._request("GET", "/v1/users")

    def create_token(self, name: str = "", user: str | None = None, scope: str = "all",
                     expires_in: float | None = None) -> dict:
        """``scope``: all, read or predict; ``expires_in``: seconds it stays valid (None: until revoked)."""
        return self._request("POST", "/v1/tokens", json={"name": name, "user": user, "scope": scope,
                                                         "expires_in": expires_in})

    def _list_tokens(self) -> list[dict]:
        return self._request("GET", "/v1/tokens")

    def revoke_token(self, token_id: int) -> None:
        self._request("DELETE", f"/v1/tokens/{token_id}")

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

    def _list_nodes(self) -> list[dict]:
        return self._request("GET", "/v1/nodes")

    def _list_servers(self) -> list[dict]:
        """The servers sharing the control plane's database, and which one leads."""
        return self._request("GET", "/v1/servers")

    def set_node_health(self, name: str, healthy: bool, gpu: int | None = None) -> dict:
        """Cordon (False) or uncordon a node or one GPU (admins)."""
        return self._request("PATCH", f"/v1/nodes/{name}", json={"healthy": healthy, "gpu": gpu})


_RESOURCES = resources(Client)

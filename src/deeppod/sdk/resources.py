"""``client.NOUN``: one class per resource, named as the API names it, with its methods written
out. Calling one lists (``client.jobs()``, as ``client.jobs.list()``); its methods act on that
resource, with one verb for one act whatever the noun: ``client.jobs.stop(7)``,
``client.experiments.stop("lr-search")``, ``client.deployments.delete("digits")``. The flat
names of the client before (``client.stop``, ``client.stop_experiment``) stay as aliases for
one release (``FLAT``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx

from deeppod.contract import FINAL_STATES
from deeppod.errors import DeepPodError, from_response
from deeppod.states import DeploymentState

if TYPE_CHECKING:
    from deeppod.sdk.client import Client


class Resource:
    def __init__(self, client: Client) -> None:
        self._client = client

    def __call__(self, *args, **kwargs) -> list[dict]:
        return self.list(*args, **kwargs)

    def list(self) -> list[dict]:
        raise NotImplementedError

    def _request(self, method: str, path: str, **kw):
        return self._client._request(method, path, **kw)


class Jobs(Resource):
    """``client.jobs``: calling it lists."""

    def list(self, state: str | None = None, limit: int = 200, *, kind: str | None = None,
             exclude_kind: str | None = None, tenant: str | None = None, user: str | None = None,
             name: str | None = None) -> list[dict]:
        """Newest first. ``kind``/``exclude_kind``: comma-separated batch, serve, evaluate, trial;
        ``name``: a part of the job's name."""
        given = {"state": state, "kind": kind, "exclude_kind": exclude_kind, "tenant": tenant, "user": user,
                 "name": name}
        params = {"limit": limit, **{k: v for k, v in given.items() if v}}
        return self._request("GET", "/v1/jobs", params=params)

    def get(self, job_id: int) -> dict:
        return self._request("GET", f"/v1/jobs/{job_id}")

    def submit(self, command: list[str], *, code: str | os.PathLike | None = None, own_folder: bool = False,
               requirements: str | os.PathLike | list[str] | None = None, **options) -> dict:
        """Submit a job. ``options`` are the fields of :class:`deeppod.JobSpec` (``workers``,
        ``gpus_per_worker``, ``datasets``...: each with its default and bounds there). ``workers``
        start together; ``max_workers`` makes it elastic. Each of ``datasets`` (NAME[@VERSION]) is
        staged hot first; workers find it in DEEPPOD_DATA_<NAME>. Each of ``models`` (NAME[@VERSION or
        @ALIAS]) is pinned at submit and read-only to the job, in DEEPPOD_MODEL_<NAME>.

        Where it runs: ``workdir``, a folder on the server; or ``code``, a folder here that is
        sent with the job (it runs in its own copy); or ``own_folder``, an empty folder of the
        job's own (for a command that needs no files). None of them: the current folder, in
        place when the server may run your jobs there, else sent as ``code``.

        Its software: the platform's Python environment; or ``requirements`` (a file, its text
        or its lines; and ``python``), a Python environment built for it; or ``image``, a
        container image the server offers (:meth:`images`)."""
        return self._request("POST", "/v1/jobs", json=self._client.job_body(
            command, code=code, own_folder=own_folder, requirements=requirements, **options))

    def cancel(self, job_id: int) -> dict:
        return self._request("POST", f"/v1/jobs/{job_id}/cancel")

    def stop(self, job_id: int) -> dict:
        """Graceful stop: the job checkpoints on SIGTERM and ends as ``stopped``."""
        return self._request("POST", f"/v1/jobs/{job_id}/stop")

    def resume(self, job_id: int) -> dict:
        """Queue a stopped job again; it continues from its checkpoint with the same id."""
        return self._request("POST", f"/v1/jobs/{job_id}/resume")

    def wait(self, job_id: int, timeout: float = 600.0, poll: float = 0.5) -> dict:
        """Block until the job ends; returns it."""

        deadline = time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job["state"] in FINAL_STATES:
                return job
            if time.monotonic() > deadline:
                raise DeepPodError(f"job {job_id} still {job['state']} after {timeout:g} s", code="timeout")
            time.sleep(poll)

    def logs(self, job_id: int, *, rank: int | None = None, follow: bool = False) -> Iterator[bytes]:
        params = {"follow": follow, **({"rank": rank} if rank is not None else {})}
        r = self._client._send(lambda http: http.send(http.build_request(
            "GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None), stream=True), replayable=True)
        try:
            if r.status_code >= 400:
                r.read()
                raise from_response(r.status_code, r.json())
            yield from r.iter_bytes()
        except httpx.TransportError as exc:
            raise DeepPodError(f"lost the log stream from {self._client.url} ({exc})", code="unreachable") from None
        finally:
            r.close()

    def events(self, job_id: int) -> list[dict]:
        return self._request("GET", f"/v1/jobs/{job_id}/events")

    def metrics(self, job_id: int, names: list[str] | None = None, max_points: int = 500) -> dict:
        params = {"max_points": max_points, **({"names": ",".join(names)} if names else {})}
        return self._request("GET", f"/v1/jobs/{job_id}/metrics", params=params)

    def histograms(self, job_id: int, name: str | None = None, max_steps: int = 50) -> list[dict]:
        params = {"max_steps": max_steps, **({"name": name} if name else {})}
        return self._request("GET", f"/v1/jobs/{job_id}/histograms", params=params)

    def gpus(self, job_id: int, since: float | None = None) -> dict:
        """The job's GPU utilization and memory over time, and its recent mean."""
        return self._request("GET", f"/v1/jobs/{job_id}/gpus", params={"since": since} if since else None)

    def usage(self, job_id: int, since: float | None = None) -> dict:
        """What the job used over time: its GPUs, CPU in cores and its processes' resident memory."""
        return self._request("GET", f"/v1/jobs/{job_id}/usage", params={"since": since} if since else None)

    def spec(self, job_id: int) -> dict:
        """A batch job's submit options: ``fields`` (a mapping) and ``yaml`` (a file that
        ``deeppod submit --spec`` submits again)."""
        return self._request("GET", f"/v1/jobs/{job_id}/spec")

    def remove_files(self, job_id: int, *, force: bool = False) -> dict:
        """Remove a finished job's folder (logs, checkpoints, outputs); its record stays."""
        return self._request("DELETE", f"/v1/jobs/{job_id}/files", params={"force": force})

    def purge(self, older_than_seconds: float) -> dict:
        """Remove the folders of finished jobs that ended longer ago (stopped jobs keep theirs)."""
        return self._request("POST", "/v1/jobs/purge", json={"older_than_seconds": older_than_seconds})


class Datasets(Resource):
    """``client.datasets``: calling it lists."""

    def list(self, query: str = "") -> list[dict]:
        return self._request("GET", "/v1/datasets", params={"q": query} if query else None)

    def get(self, ref: str) -> dict:
        return self._request("GET", f"/v1/datasets/{ref}")

    def ingest(self, name: str, source: str, *, policy: dict | None = None, tags: dict | None = None,
               description: str | None = None, progress=None, s3_endpoint: str | None = None,
               s3_key_id: str | None = None, s3_secret: str | None = None) -> dict:
        """Ingest a folder, an archive or ``s3://bucket/prefix`` as the next version of ``name``.
        ``progress(files_done, files_total, bytes_done, bytes_total)`` is called as it uploads."""
        import json

        from deeppod.sdk.sources import open_source

        src = open_source(source, s3_endpoint=s3_endpoint or self._client.s3_endpoint, s3_key_id=s3_key_id,
                          s3_secret=s3_secret)
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

    def update(self, name: str, **changes) -> dict:
        return self._request("PATCH", f"/v1/datasets/{name}", json=changes)

    def set_policy(self, name: str, policy: dict, replace: bool = False) -> dict:
        return self._request("PUT", f"/v1/datasets/{name}/policy", json={"policy": policy, "replace": replace})

    def remove_version(self, ref: str) -> dict:
        """Delete NAME@VERSION and the stored images no other version names."""
        return self._request("DELETE", f"/v1/datasets/{ref}")

    def stage(self, ref: str, tier: str = "hot") -> dict:
        return self._request("POST", f"/v1/datasets/{ref}/stage", params={"tier": tier}, timeout=None)

    def token_counts(self, ref: str, model: str) -> dict:
        """Text version ``ref`` counted in language model ``model``'s tokens (NAME@VERSION each)."""
        return self._request("GET", f"/v1/datasets/{ref}/tokens", params={"model": model}, timeout=None)

    def manifest(self, ref: str) -> list[dict]:
        import json

        r = self._client._send(lambda http: http.get(f"/v1/datasets/{ref}/manifest"), replayable=True)
        if r.status_code >= 400:
            raise from_response(r.status_code, r.json())
        return [json.loads(line) for line in r.text.splitlines() if line]


class Experiments(Resource):
    """``client.experiments``: calling it lists."""

    def list(self) -> list[dict]:
        return self._request("GET", "/v1/experiments")

    def get(self, name: str, tenant: str | None = None) -> dict:
        return self._request("GET", f"/v1/experiments/{name}", params={"tenant": tenant} if tenant else None)

    def create(self, name: str, command: list[str], *, space: dict, metric: str, mode: str = "max",
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
            "register_at_chance": register_at_chance, "reuse": reuse, "job": self._client.job_body(command, **job)})

    def stop(self, name: str) -> dict:
        return self._request("POST", f"/v1/experiments/{name}/stop")

    def resume(self, name: str) -> dict:
        return self._request("POST", f"/v1/experiments/{name}/resume")


class Models(Resource):
    """``client.models``: calling it lists."""

    def list(self) -> list[dict]:
        return self._request("GET", "/v1/models")

    def get(self, name: str) -> dict:
        return self._request("GET", f"/v1/models/{name}")

    def version(self, ref: str) -> dict:
        """NAME@VERSION or NAME@ALIAS."""
        return self._request("GET", f"/v1/models/{ref}/version")

    def register(self, name: str, *, job_id: int | None = None, path: str | None = None,
                       description: str | None = None, aliases: list[str] | None = None) -> dict:
        """A new version of model ``name`` from a job's artifact (JOB_DIR/model) or a server folder."""
        return self._request("POST", f"/v1/models/{name}/versions", json={
            "job_id": job_id, "path": path, "description": description, "aliases": aliases or []})

    def remove(self, ref: str) -> list[int]:
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
        self._client.jobs.wait(job["job_id"], timeout=timeout)
        return self.comparison(name, job["job_id"])

    def promote(self, name: str, version: str | int, *, force: bool = False) -> dict:
        return self._request("POST", f"/v1/models/{name}/promote", json={"version": str(version), "force": force})


class Deployments(Resource):
    """``client.deployments``: calling it lists."""

    def list(self) -> list[dict]:
        return self._request("GET", "/v1/deployments")

    def get(self, name: str) -> dict:
        return self._request("GET", f"/v1/deployments/{name}", headers={"accept": "application/json"})

    def create(self, model: str, *, name: str | None = None, replicas: int = 1, gpus_per_replica: int = 0,
               cpus_per_replica: float = 1.0, max_batch: int = 32, max_wait_ms: float = 5.0) -> dict:
        return self._request("POST", "/v1/deployments", json={
            "model": model, "name": name, "replicas": replicas, "gpus_per_replica": gpus_per_replica,
            "cpus_per_replica": cpus_per_replica, "max_batch": max_batch, "max_wait_ms": max_wait_ms})

    def update(self, name: str, *, version: str | int | None = None, replicas: int | None = None,
                          max_batch: int | None = None, max_wait_ms: float | None = None) -> dict:
        return self._request("PATCH", f"/v1/deployments/{name}", json={
            "version": None if version is None else str(version), "replicas": replicas, "max_batch": max_batch,
            "max_wait_ms": max_wait_ms})

    def rollback(self, name: str) -> dict:
        return self._request("POST", f"/v1/deployments/{name}/rollback")

    def delete(self, name: str) -> None:
        self._request("DELETE", f"/v1/deployments/{name}")

    def create_key(self, name: str, label: str = "") -> dict:
        return self._request("POST", f"/v1/deployments/{name}/keys", json={"name": label})

    def keys(self, name: str) -> list[dict]:
        return self._request("GET", f"/v1/deployments/{name}/keys")

    def revoke_key(self, name: str, key_id: int) -> dict:
        return self._request("DELETE", f"/v1/deployments/{name}/keys/{key_id}")

    def wait(self, name: str, *, version: int | None = None, timeout: float = 300.0,
                        poll: float = 0.5) -> dict:
        """Until every replica is healthy (on ``version`` when given) and nothing old is left."""

        deadline = time.monotonic() + timeout
        while True:
            d = self.get(name)
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

    def direct(self, name: str, *, ttl: float = 600.0):
        """A :class:`~deeppod.sdk.direct.DirectPredictor`: ``.predict(...)`` as :meth:`predict`
        takes it, sent to the replicas past the control plane."""
        from deeppod.sdk.direct import DirectPredictor

        return DirectPredictor(self, name, ttl=ttl)

    def direct_token(self, name: str, *, ttl: float = 600.0) -> dict:
        """A token to call the deployment's replicas directly, and where they are (the API's
        ``POST /v1/deployments/NAME/direct``)."""
        return self._request("POST", f"/v1/deployments/{name}/direct", json={"ttl_seconds": ttl})

    def revoke_direct(self, name: str) -> dict:
        return self._request("DELETE", f"/v1/deployments/{name}/direct")


class Nodes(Resource):
    """``client.nodes``: calling it lists."""

    def list(self) -> list[dict]:
        return self._request("GET", "/v1/nodes")

    def set_health(self, name: str, healthy: bool, gpu: int | None = None) -> dict:
        """Cordon (False) or uncordon a node or one GPU (admins)."""
        return self._request("PATCH", f"/v1/nodes/{name}", json={"healthy": healthy, "gpu": gpu})

    def gpus(self) -> list[dict]:
        """Each GPU's newest sample (another tenant's job shows as busy only)."""
        return self._request("GET", "/v1/monitor/gpus")

    def hosts(self) -> list[dict]:
        return self._request("GET", "/v1/monitor/hosts")

    def burst(self) -> dict:
        """Burst node types (nodes up and asked for), each tenant's burst cost, and the budgets."""
        return self._request("GET", "/v1/burst")


class Servers(Resource):
    """``client.servers``: calling it lists."""

    def list(self) -> list[dict]:
        """The servers sharing the control plane's database, and which one leads."""
        return self._request("GET", "/v1/servers")


class Tenants(Resource):
    """``client.tenants``: calling it lists."""

    def list(self) -> list[dict]:
        return self._request("GET", "/v1/tenants")

    def create(self, name: str) -> dict:
        return self._request("POST", "/v1/tenants", json={"name": name})


class Users(Resource):
    """``client.users``: calling it lists."""

    def list(self) -> list[dict]:
        return self._request("GET", "/v1/users")

    def create(self, name: str, tenant: str, admin: bool = False, role: str = "member") -> dict:
        """``role``: admin, tenant-admin, member or viewer (``admin=True`` is role admin)."""
        return self._request("POST", "/v1/users", json={"name": name, "tenant": tenant, "admin": admin, "role": role})

    def set_role(self, name: str, role: str) -> dict:
        """Change a user's role: admin, tenant-admin, member or viewer."""
        return self._request("PATCH", f"/v1/users/{name}", json={"role": role})


class Notebooks(Resource):
    """``client.notebooks``: JupyterLab as a job in your sandbox (docs/notebooks.md); calling it lists."""

    def list(self, limit: int = 200) -> list[dict]:
        return self._request("GET", "/v1/notebooks", params={"limit": limit})

    def get(self, job_id: int) -> dict:
        return self._request("GET", f"/v1/notebooks/{job_id}")

    def start(self, **options) -> dict:
        """Queue one. ``options``: ``gpus_per_worker``, ``cpus_per_worker``, ``memory_mb_per_worker``,
        ``requirements`` (a requirements.txt's text), ``python``, ``image``, ``datasets``, ``network``,
        ``priority``, ``idle_seconds`` (default: the plan's, else the server's), ``name``. Its
        ``url`` is a path on the server: open it signed in to the console."""
        return self._request("POST", "/v1/notebooks", json=options)

    def stop(self, job_id: int) -> dict:
        """Stop it; its files stay, and :meth:`resume` brings it back."""
        return self._request("POST", f"/v1/notebooks/{job_id}/stop")

    def resume(self, job_id: int, idle_seconds: float | None = None) -> dict:
        return self._request("POST", f"/v1/notebooks/{job_id}/resume",
                             json={"idle_seconds": idle_seconds} if idle_seconds is not None else None)


class Tokens(Resource):
    """``client.tokens``: calling it lists."""

    def list(self) -> list[dict]:
        return self._request("GET", "/v1/tokens")

    def create(self, name: str = "", user: str | None = None, scope: str = "all",
                     expires_in: float | None = None) -> dict:
        """``scope``: all, read or predict; ``expires_in``: seconds it stays valid (None: until revoked)."""
        return self._request("POST", "/v1/tokens", json={"name": name, "user": user, "scope": scope,
                                                         "expires_in": expires_in})

    def revoke(self, token_id: int) -> None:
        self._request("DELETE", f"/v1/tokens/{token_id}")


RESOURCES: dict[str, type[Resource]] = {"jobs": Jobs, "datasets": Datasets, "experiments": Experiments,
                                        "models": Models, "deployments": Deployments, "nodes": Nodes,
                                        "servers": Servers, "tenants": Tenants, "users": Users, "tokens": Tokens,
                                        "notebooks": Notebooks}
# the client's flat names before the resources: flat name -> (resource, method)
FLAT: dict[str, tuple[str, str]] = {"burst": ("nodes", "burst"), "cancel": ("jobs", "cancel"),
    "compare": ("models", "compare"), "compare_and_wait": ("models", "compare_and_wait"),
    "comparison": ("models", "comparison"), "create_deployment_key": ("deployments", "create_key"),
    "create_experiment": ("experiments", "create"), "create_tenant": ("tenants", "create"),
    "create_token": ("tokens", "create"), "create_user": ("users", "create"), "dataset": ("datasets", "get"),
    "delete_deployment": ("deployments", "delete"), "deploy": ("deployments", "create"),
    "deployment": ("deployments", "get"), "deployment_keys": ("deployments", "keys"),
    "direct": ("deployments", "direct"), "direct_token": ("deployments", "direct_token"),
    "events": ("jobs", "events"), "experiment": ("experiments", "get"), "gpus": ("nodes", "gpus"),
    "histograms": ("jobs", "histograms"), "hosts": ("nodes", "hosts"), "ingest": ("datasets", "ingest"),
    "job": ("jobs", "get"), "job_gpus": ("jobs", "gpus"), "job_spec": ("jobs", "spec"),
    "job_usage": ("jobs", "usage"), "logs": ("jobs", "logs"), "manifest": ("datasets", "manifest"),
    "metrics": ("jobs", "metrics"), "model": ("models", "get"), "model_version": ("models", "version"),
    "predict": ("deployments", "predict"), "promote": ("models", "promote"), "purge_jobs": ("jobs", "purge"),
    "register_model": ("models", "register"), "remove_dataset_version": ("datasets", "remove_version"),
    "remove_job_files": ("jobs", "remove_files"), "remove_model": ("models", "remove"), "resume": ("jobs", "resume"),
    "resume_experiment": ("experiments", "resume"), "revoke_deployment_key": ("deployments", "revoke_key"),
    "revoke_direct": ("deployments", "revoke_direct"), "revoke_token": ("tokens", "revoke"),
    "rollback": ("deployments", "rollback"), "set_alias": ("models", "set_alias"),
    "set_data_policy": ("datasets", "set_policy"), "set_node_health": ("nodes", "set_health"),
    "set_role": ("users", "set_role"), "stage": ("datasets", "stage"), "stop": ("jobs", "stop"),
    "stop_experiment": ("experiments", "stop"), "submit": ("jobs", "submit"),
    "update_dataset": ("datasets", "update"), "update_deployment": ("deployments", "update"),
    "wait": ("jobs", "wait"), "wait_deployment": ("deployments", "wait")}

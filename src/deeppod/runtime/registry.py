"""Inside a job: register the model the job wrote (stdlib only; the job's token authorises it)."""

from __future__ import annotations

import json
import os
import urllib.error
from pathlib import Path

from deeppod.contract import ENV_API_URL, ENV_CA_CERT, ENV_JOB_ID, ENV_TOKEN, model_env_key, open_first, server_urls


def model_path(name: str) -> Path:
    """The folder of a registered model this job reads (submitted with --model NAME[@VERSION]):
    read-only, the version pinned at submit (DEEPPOD_MODEL_<NAME>)."""
    from deeppod.runtime.shards import given_folder

    return given_folder(model_env_key(name), "model", name, "--model")


def api_call(method: str, path: str, body: dict | None = None, *, timeout: float = 30.0) -> dict:
    """One call to the control plane as this job (DEEPPOD_API_URL, DEEPPOD_TOKEN)."""
    url, token = os.environ.get(ENV_API_URL), os.environ.get(ENV_TOKEN)
    if not url or not token:
        raise RuntimeError("not running under DeepPod (DEEPPOD_API_URL and DEEPPOD_TOKEN are not set)")
    try:  # DEEPPOD_API_URL names every server of a failover control plane: the first that answers
        raw = open_first(server_urls(url), path, method=method,
                         data=None if body is None else json.dumps(body).encode(),
                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
                         timeout=timeout, cafile=os.environ.get(ENV_CA_CERT))
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"the server answered {exc.code}: {error_message(exc.read())}") from None
    except (OSError, urllib.error.URLError) as exc:
        raise RuntimeError(f"cannot reach the server at {url}: {exc}") from None
    return json.loads(raw) if raw else {}


def error_message(raw: bytes) -> str:
    """The message of an API error body (``{"error": {"code", "message"}}``), else the raw text."""
    text = raw.decode(errors="replace")
    try:
        err = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return text
    if isinstance(err, dict) and err.get("message"):
        return f"{err['message']} ({err.get('code', 'error')})"
    return text


def register_model(name: str, artifact: str | os.PathLike, *, description: str | None = None) -> dict:
    """Register ``artifact`` (a folder with model.pt2 and signature.json) as the next version of
    model ``name``, with this job as its lineage. Returns the new version."""
    job_id = os.environ.get(ENV_JOB_ID)
    body = {"path": str(Path(artifact).resolve()), "job_id": int(job_id) if job_id else None}
    if description is not None:
        body["description"] = description
    return api_call("POST", f"/v1/models/{name}/versions", body)

"""A pytest plugin that points the ceph/s3-tests suite at DeepPod's S3 endpoint.

The suite makes a new bucket for every test. DeepPod's buckets are fixed (docs/datasets.md):
writes go to ``inbox``, under a dataset's name. So every bucket a test makes is a dataset's
name in the inbox: ``Bucket=B, Key=K`` is sent as ``Bucket=inbox, Key=B/K`` (and prefixes,
markers, copy sources and deleted keys likewise), and the answers have ``B/`` taken off
again. Making and deleting a bucket are answered here, in the client (the server has no such
operation: CreateBucket answers NotImplemented); every object operation goes to the server
as the suite wrote it. The suite's own clean-up (ListObjectVersions, then DeleteObjects and
DeleteBucket) is replaced by a listing and a delete of what the test left.

Loaded by scripts/s3_conformance/run.py with ``-p plugin``; not a DeepPod module.
"""

from __future__ import annotations

import threading
import urllib.parse

import botocore.session

INBOX = "inbox"
_made: dict[str, set[str]] = {}  # access key id -> the buckets its tests made
_lock = threading.Lock()


class _Answer:
    """What botocore takes as the HTTP side of an answer given in the client."""

    status_code = 200
    headers: dict = {}
    content = b""
    raw = None


def _key(bucket: str, key: str) -> str:
    return f"{bucket}/{key}"


def _strip(bucket: str, value):
    prefix = bucket + "/"
    if isinstance(value, str) and value.startswith(prefix):
        return value[len(prefix):]
    return value


LISTINGS = ("ListObjects", "ListObjectsV2", "ListMultipartUploads")


def _rewrite_params(params, model, context, **_):
    bucket = params.get("Bucket")
    if not bucket or bucket == INBOX:
        return
    context["s3tests_bucket"] = bucket
    params["Bucket"] = INBOX
    if "Key" in params:
        params["Key"] = _key(bucket, params["Key"])
    for name in ("Prefix", "Marker", "StartAfter", "KeyMarker"):
        if name == "Prefix" and model.name in LISTINGS or params.get(name):
            params[name] = _key(bucket, params.get(name) or "")
    for obj in (params.get("Delete") or {}).get("Objects", []):
        obj["Key"] = _key(bucket, obj["Key"])
    source = params.get("CopySource")
    if isinstance(source, dict) and source.get("Bucket") not in (None, INBOX):
        params["CopySource"] = {**source, "Bucket": INBOX, "Key": _key(source["Bucket"], source["Key"])}
    elif isinstance(source, str) and not source.lstrip("/").startswith(INBOX + "/"):
        path, _, query = source.lstrip("/").partition("?")
        params["CopySource"] = f"{INBOX}/{path}" + (f"?{query}" if query else "")


def _rewrite_answer(parsed, context, **_):
    bucket = context.get("s3tests_bucket")
    if not bucket or not isinstance(parsed, dict):
        return
    for name in ("Key", "Prefix", "Marker", "NextMarker", "StartAfter", "KeyMarker", "NextKeyMarker"):
        if name in parsed:
            parsed[name] = _strip(bucket, parsed[name])
    for name in ("Name", "Bucket"):
        if parsed.get(name) == INBOX:
            parsed[name] = bucket
    for listed in ("Contents", "Uploads", "Deleted", "Errors"):
        for item in parsed.get(listed) or []:
            if "Key" in item:
                item["Key"] = _strip(bucket, item["Key"])
    for item in parsed.get("CommonPrefixes") or []:
        item["Prefix"] = _strip(bucket, item["Prefix"])
    if isinstance(parsed.get("Location"), str):
        parsed["Location"] = parsed["Location"].replace(f"/{INBOX}/{urllib.parse.quote(bucket)}/", f"/{bucket}/")


def _access_key(request_signer) -> str:
    creds = getattr(request_signer, "_credentials", None)
    return getattr(creds, "access_key", "") if creds is not None else ""


def _made_here(client):
    """CreateBucket and DeleteBucket, answered in the client (before-call: the bucket's name
    is in the context, the request already says inbox)."""
    def create(context, **_):
        bucket = context["s3tests_bucket"]
        with _lock:
            _made.setdefault(_access_key(client._request_signer), set()).add(bucket)
        return _Answer(), {"Location": f"/{bucket}"}

    def delete(context, **_):
        with _lock:
            _made.get(_access_key(client._request_signer), set()).discard(context.get("s3tests_bucket"))
        answer = _Answer()
        answer.status_code = 204
        return answer, {}

    return create, delete


def _with_buckets(create_client):
    def create(self, service_name, *args, **kwargs):
        client = create_client(self, service_name, *args, **kwargs)
        if service_name == "s3":
            events = client.meta.events
            events.register_first("before-parameter-build.s3", _rewrite_params)
            events.register_last("after-call.s3", _rewrite_answer)
            made, gone = _made_here(client)
            events.register("before-call.s3.CreateBucket", made)
            events.register("before-call.s3.DeleteBucket", gone)
        return client

    return create


botocore.session.Session.create_client = _with_buckets(botocore.session.Session.create_client)


def _buckets(client=None, prefix=None):
    import s3tests.functional as suite

    client = client or suite.get_client()
    prefix = prefix if prefix is not None else suite.get_prefix()
    return sorted(b for b in _made.get(_access_key(client._request_signer), set()) if b.startswith(prefix))


def _nuke(client, bucket):
    """What a test left under its bucket, deleted; then the bucket forgotten."""
    token = None
    while True:
        page = client.list_objects_v2(Bucket=bucket, **({"ContinuationToken": token} if token else {}))
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            break
    client.delete_bucket(Bucket=bucket)


def pytest_configure(config):
    import s3tests.functional as suite

    configure = suite.configure

    def configured():
        configure()
        # DeepPod answers S3 under /s3 of its API port, path-style
        suite.config.default_endpoint = suite.config.default_endpoint.rstrip("/") + "/s3"

    suite.configure = configured
    suite.get_buckets_list = _buckets
    suite.nuke_bucket = _nuke

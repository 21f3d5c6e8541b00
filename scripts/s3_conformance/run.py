"""Runs the ceph/s3-tests conformance suite against a fresh DeepPod server (docs/s3-tests.md).

    python3 -m venv /tmp/s3tv && /tmp/s3tv/bin/pip install -r S3TESTS/requirements.txt
    .venv/bin/python scripts/s3_conformance/run.py --suite S3TESTS --python /tmp/s3tv/bin/python

S3TESTS is a checkout of https://github.com/ceph/s3-tests (not shipped here, and not fetched
by this script). It starts a DeepPod server on a free loopback port with a home of its own,
makes the suite's three users (main, alt and tenant, each in a tenant of its own) and a write
access key for each, writes the suite's configuration, and runs the suite's
``s3tests/functional/test_s3.py`` and ``test_headers.py`` with ``plugin.py`` loaded (every bucket a test makes is a
dataset's name in the ``inbox`` bucket). The suite's tests of features DeepPod does not offer
(ACLs, policies, versioning, lifecycle, encryption, logging, tagging, object lock, ...) are
left out by their markers and names; the rest run, and each one's outcome is written to
``--out`` as JSON with a summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

# features DeepPod answers NotImplemented for (docs/datasets.md, "Operations"), by marker ...
MARKERS = ("bucket_logging", "bucket_logging_cleanup", "encryption", "lifecycle", "lifecycle_expiration",
           "lifecycle_transition", "bucket_policy", "tagging", "sse_s3", "bucket_encryption", "object_ownership",
           "cloud_transition", "cloud_restore", "delete_marker", "iam_user", "iam_account", "fails_on_aws",
           "fails_without_logging_rollover", "target_by_bucket", "s3select", "s3website", "versioning",
           "object_lock", "appendobject", "user_policy", "group_policy", "role_policy", "session_policy")
# ... and by words in their names
WORDS = ("acl", "versioning", "versioned", "version", "lock", "retention", "legal_hold", "policy", "lifecycle",
         "cors", "website", "logging", "tagging", "tags", "encryption", "sse", "torrent", "request_payment",
         "accelerate", "notification", "ownership", "public_block", "block_public", "bucket_create",
         "bucket_naming", "buckets_create", "bucket_recreate", "bucket_delete",
         "list_buckets", "bucket_head", "bucket_location", "ratelimit", "restore", "storage_class",
         "transition", "anon", "atomic_dual", "post_object", "multipart_copy_versioned", "bucket_policy",
         "append", "delete_marker", "get_bucket", "put_bucket", "set_bucket", "bucket_access",
         "access_bucket", "grant", "bucketv2_policy", "account_usage", "head_bucket_usage",
         "chunk_size_bug")
# (-k matches a test's markers too: no word here may be part of one, as "rgw" is of fails_on_rgw)


def setup_server(home: Path):
    sys.path.insert(0, str(ROOT))
    from deeppod import Client
    from tests.helpers import LiveServer

    server = LiveServer(home).start()
    admin = Client(server.url, server.admin_token)
    users = {}
    for role in ("main", "alt", "tenant"):
        admin.create_tenant(f"s3{role}")
        token = admin.create_user(f"s3-{role}", f"s3{role}")["token"]
        key = Client(server.url, token).create_access_key(name=f"s3-tests {role}", scope="write")
        users[role] = key
    return server, users


def write_conf(path: Path, port: int, users: dict) -> None:
    sections = ["[DEFAULT]", "host = 127.0.0.1", f"port = {port}", "is_secure = False", "ssl_verify = False",
                "[fixtures]", "bucket prefix = s3t-{random}-"]
    for role, section in (("main", "s3 main"), ("alt", "s3 alt"), ("tenant", "s3 tenant")):
        k = users[role]
        sections += [f"[{section}]", f"display_name = {role}", f"user_id = s3-{role}", f"email = {role}@example.com",
                     f"access_key = {k['key_id']}", f"secret_key = {k['secret']}", "api_name = default"]
        if role == "tenant":
            sections.append("tenant = s3tenant")
    for section in ("iam", "iam root", "iam alt root"):  # the suite reads them; no IAM test runs
        k = users["main"]
        sections += [f"[{section}]", f"access_key = {k['key_id']}", f"secret_key = {k['secret']}",
                     "display_name = iam", "user_id = iam", "email = iam@example.com"]
    path.write_text("\n".join(sections) + "\n")


def outcomes(junit: Path) -> dict[str, dict]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name")
        state, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                state = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                why = (found.get("message") or "")[:300]
                break
        out[f"{case.get('classname', '').rsplit('.', 1)[-1]}::{name}"] = {"outcome": state, "message": why}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", type=Path, required=True, help="a checkout of github.com/ceph/s3-tests")
    ap.add_argument("--python", default=sys.executable, help="a Python with the suite's requirements")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "s3_tests.json")
    ap.add_argument("-k", default="", help="narrow the run further (pytest -k)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server, users = setup_server(Path(tmp) / "home")
        try:
            conf, junit = Path(tmp) / "s3tests.conf", Path(tmp) / "junit.xml"
            write_conf(conf, server.port, users)
            words = " or ".join(WORDS)
            select = f"not ({words})" + (f" and ({args.k})" if args.k else "")
            cmd = [args.python, "-m", "pytest", "-p", "plugin", "-q", "-p", "no:cacheprovider",
                   *(str(args.suite / "s3tests" / "functional" / f) for f in ("test_s3.py", "test_headers.py")), "-m",
                   "not (" + " or ".join(MARKERS) + ")", "-k", select, f"--junitxml={junit}", "-o",
                   "junit_family=xunit1"]
            env = {**os.environ, "S3TEST_CONF": str(conf),
                   "PYTHONPATH": os.pathsep.join([str(HERE), str(args.suite)])}
            subprocess.run(cmd, env=env, cwd=args.suite)
            results = outcomes(junit)
        finally:
            server.stop()
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    args.out.write_text(json.dumps({"suite": str(args.suite), "counts": counts, "tests": results}, indent=1))
    print(json.dumps(counts), f"written to {args.out}")


if __name__ == "__main__":
    main()

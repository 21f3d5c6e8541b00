"""Register -> compare -> promote -> deploy -> predict on real data (scikit-learn digits)
with the built-in trainer, then a rolling update and a rollback under concurrent load."""

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from deeppod import Client
from deeppod.executor import sandbox
from deeppod.job_folder import JobFolder
from deeppod.runtime import inference
from deeppod.runtime.data import ShardReader
from deeppod.runtime.trainers.digits import write_digits
from tests.helpers import LiveServer, wait_until

pytestmark = pytest.mark.slow
MODEL = "digits-clf"


def run(cli_env, *args, ok=True, timeout=600, cwd=None):
    p = subprocess.run([sys.executable, "-m", "deeppod.cli", *args], env=cli_env, capture_output=True, text=True,
                       timeout=timeout, cwd=cwd)
    if ok:
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


@pytest.fixture(scope="module", params=["sandbox"])
def flow(tmp_path_factory, request):
    """The whole flow with every job sandboxed as its tenant: what a user gets as root. (Run as
    one trusted user too it cost 90 s more of the suite and covered no code the unsandboxed
    executor tests do not.)"""
    if request.param == "sandbox" and sandbox.supported() is not None:
        pytest.skip(sandbox.supported())
    tmp = tmp_path_factory.mktemp("serving")
    work = tmp / "work"  # the tenant's root: where it trains from
    work.mkdir()
    os.chmod(tmp, 0o755)
    server = LiveServer(tmp / "home", extra_env={"DEEPPOD_PREDICT_MAX_BYTES": str(1 << 20),
                                                 "DEEPPOD_ISOLATION": request.param,
                                                 "DEEPPOD_WORK_ROOTS": str(work)}).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"DEEPPOD_API_URL": server.url, "DEEPPOD_TOKEN": server.admin_token,
                "DEEPPOD_CONFIG": str(tmp / "c.json"), "COLUMNS": "200"})
    try:
        run(env, "data", "ingest", "digits", str(write_digits(tmp / "digits")), "--split", "val=0.2")
        common = ["train", "image-classifier", "--dataset", "digits", "--model", "small-cnn", "--image-size", "16",
                  "--batch-size", "32", "--lr", "0.05", "--min-crop", "0.8", "--no-hflip", "--loader-workers", "0",
                  "-f"]
        # v1: a few steps only (a weak model, maybe no better than chance), registered by the trainer itself
        p = run(env, *common, "--epochs", "1", "--max-steps", "3", "--register", MODEL, "--register-at-chance",
                cwd=work)
        weak_job = int(p.stdout.split()[1])
        # v2: trained properly, registered from its job
        p = run(env, *common, "--epochs", "6", cwd=work)
        strong_job = int(p.stdout.split()[1])
        yield {"server": server, "env": env, "weak_job": weak_job, "strong_job": strong_job, "tmp": tmp,
               "client": Client(server.url, server.admin_token)}
    finally:
        server.stop()
        server.cleanup_jobs()


@pytest.mark.timeout(960)  # its own longest wait, and a minute to report
def test_register_compare_promote_deploy_predict(flow):
    env, c, server = flow["env"], flow["client"], flow["server"]
    m = c.model(MODEL)
    assert [v["version"] for v in m["versions"]] == [1], "the trainer registered v1 itself"
    assert m["versions"][0]["lineage"]["job_id"] == flow["weak_job"]
    p = run(env, "models", "register", MODEL, "--from-job", str(flow["strong_job"]))
    assert f"registered {MODEL}@2" in p.stdout
    v2 = c.model_version(f"{MODEL}@2")
    lin = v2["lineage"]
    assert lin["job_id"] == flow["strong_job"] and lin["dataset"] == "digits@1" and lin["datasets"] == ["digits@1"]
    assert lin["hyperparameters"]["epochs"] == 6 and "deeppod.runtime.trainers.image_classifier" in lin["command"]
    assert v2["signature"]["classes"] == [str(i) for i in range(10)] and v2["signature"]["input"]["crop"] == "center"
    assert len(v2["sha256"]) == 64 and v2["metrics"]["val_accuracy"] > 0.5

    run(env, "models", "alias", MODEL, "champion", "1")
    p = run(env, "models", "promote", MODEL, "2", ok=False)
    assert p.returncode == 2 and "no comparison" in p.stderr, p.stderr
    p = run(env, "models", "compare", MODEL, "champion", "2", "--data", "digits@1", timeout=900)
    assert "v1 vs v2 on digits@1" in p.stdout and "class 7" in p.stdout, p.stdout
    evals = {e["version"]: e for e in c.model(MODEL)["evaluations"]}
    assert evals[2]["accuracy"] > evals[1]["accuracy"], evals
    assert evals[2]["samples"] == evals[1]["samples"] == len(ShardReader(server.home / "data" / "hot" / "default"
                                                                         / "digits" / "v1", "val"))
    assert set(evals[2]["per_class"]) == {str(i) for i in range(10)}
    p = run(env, "models", "promote", MODEL, "1", ok=False)  # v1 lost the comparison
    assert p.returncode == 2 and "is already the champion" in p.stderr
    p = run(env, "models", "promote", MODEL, "2")
    assert "champion is now v2" in p.stdout and "beats champion v1" in p.stdout
    assert c.model(MODEL)["aliases"]["champion"] == 2

    p = run(env, "deploy", f"{MODEL}@champion", "--replicas", "2", "--max-batch", "16", "--max-wait-ms", "10",
            timeout=300)
    assert "ready" in p.stdout and f"try it in the console: {server.url}/deployments/{MODEL}#try-it" in p.stdout, \
        p.stdout
    # the printed curl line works when pasted into a shell (a digit image as picture.jpg)
    curl = next(line for line in p.stdout.splitlines() if line.startswith("predict: ")).removeprefix("predict: ")
    tmp = flow["tmp"]
    (tmp / "picture.jpg").write_bytes(ShardReader(server.home / "data" / "hot" / "default" / "digits" / "v1",
                                                  "val").read(0)[0])
    shell_env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    answer = subprocess.run(["bash", "-c", curl + " --fail-with-body -s"], env=shell_env, cwd=tmp,
                            capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0 and "predictions" in json.loads(answer.stdout), answer.stdout + answer.stderr
    d = c.deployment(MODEL)
    assert d["version"] == 2 and sum(r["routed"] for r in d["replica_jobs"]) == 2
    replica_jobs = [c.job(r["job_id"]) for r in d["replica_jobs"]]
    assert all(not j["preemptible"] for j in replica_jobs)

    # predictions equal the registered model run directly on the same images
    reader = ShardReader(server.home / "data" / "hot" / "default" / "digits" / "v1", "val")
    images = [reader.read(i)[0] for i in range(24)]
    model = inference.load(server.home / "models" / "default" / MODEL / "v2", device="cpu")
    direct = inference.top_k(inference.forward(model, [inference.decode(b, model.signature) for b in images]),
                             model.classes, 3)
    served = c.predict(MODEL, images, top_k=3)
    assert served["version"] == 2 and len(served["predictions"]) == 24
    for a, b in zip(served["predictions"], direct):
        assert a["label"] == b["label"]
        assert abs(a["confidence"] - b["confidence"]) < 1e-4
    truth = [reader.classes[reader.read(i)[1]] for i in range(24)]
    assert sum(a["label"] == t for a, t in zip(served["predictions"], truth)) >= 18

    # JSON: base64 images and tensors give the same answers
    import base64

    r = httpx.post(f"{server.url}/v1/deployments/{MODEL}/predict",
                   json={"images": [base64.b64encode(images[0]).decode()],
                   "top_k": 2}, headers={"Authorization": f"Bearer {server.admin_token}"})
    assert r.status_code == 200 and r.json()["predictions"][0]["label"] == direct[0]["label"]
    from deeppod.runtime.data import normalize

    x = normalize(inference.decode(images[0], model.signature)[None], model.signature["input"]["mean"],
                  model.signature["input"]["std"])[0]
    r = c.predict(MODEL, tensors=[x.tolist()], top_k=1)
    assert r["predictions"][0]["label"] == direct[0]["label"]

    # the replica itself answers only the control plane: a job that finds its port gets a 401
    endpoint = c.deployment(MODEL)["replica_jobs"][0]["endpoint"]
    direct = httpx.post(endpoint + "/predict", content=images[0], headers={"content-type": "image/png"})
    assert direct.status_code == 401 and "control plane" in direct.text, direct.text
    assert httpx.get(endpoint + "/signature").status_code == 401

    # a deployment key works for predict only
    key = c.create_deployment_key(MODEL, "kiosk")["key"]

    def with_key():
        return httpx.post(f"{server.url}/v1/deployments/{MODEL}/predict", content=images[0],
                          headers={"X-DeepPod-Key": key, "content-type": "image/png"}, timeout=30)

    wait_until(lambda: with_key().status_code != 401, 30, interval=0.2,
               what="the router to learn the key (it does each round)")
    r = with_key()
    assert r.status_code == 200, r.text
    assert httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 401
    assert httpx.post(f"{server.url}/v1/deployments/{MODEL}/predict", content=images[0],
                      headers={"content-type": "image/png"}).status_code == 401
    p = run(env, "deploy", "key", "ls", MODEL)
    assert "kiosk" in p.stdout
    key_id = c.deployment_keys(MODEL)[0]["id"]
    run(env, "deploy", "key", "revoke", MODEL, str(key_id))
    wait_until(lambda: with_key().status_code == 401, 30, interval=0.2, what="the revoked key to be refused")

    # the browser page, built from the signature by its script, and the metrics
    page = httpx.get(f"{server.url}/v1/deployments/{MODEL}", headers={"accept": "text/html"})
    assert page.status_code == 200 and "signature" in page.text and "<form" in page.text
    text = httpx.get(f"{server.url}/v1/deployments/{MODEL}/metrics",
                     headers={"Authorization": f"Bearer {server.admin_token}"}).text
    assert "deeppod_batch_size_bucket" in text and "deeppod_predict_latency_seconds_count" in text
    assert "deeppod_router_requests_total" in text


def test_a_direct_token_calls_the_replicas_itself_and_its_revocation_reaches_the_replica(flow):
    env, c, server = flow["env"], flow["client"], flow["server"]
    reader = ShardReader(server.home / "data" / "hot" / "default" / "digits" / "v1", "val")
    images = [reader.read(i)[0] for i in range(8)]
    through = c.predict(MODEL, images, top_k=3)["predictions"]

    # the CLI prints a token and a curl line per replica
    g = json.loads(run(env, "deploy", "direct", MODEL, "--json").stdout)
    assert len(g["replicas"]) == 2 and g["token"].startswith("dpd1.") and g["expires_at"] > time.time() + 500
    printed = run(env, "deploy", "direct", MODEL).stdout
    assert printed.count("curl -H 'Authorization: Bearer dpd1.") == 2 and "/predict" in printed, printed
    # the SDK spreads calls over the replicas; they answer as the platform does
    replicas = set()
    with c.direct(MODEL) as d:
        for _ in range(4):
            r = d.predict(images, top_k=3)
            replicas.add(r["replica"])
            assert [p["label"] for p in r["predictions"]] == [p["label"] for p in through]
            for a, b in zip(r["predictions"], through):
                assert abs(a["confidence"] - b["confidence"]) < 1e-4
    assert len(replicas) == 2, replicas
    p = run(env, "deploy", "predict", MODEL, "--direct", str(flow["tmp"] / "picture.jpg"))
    assert "picture.jpg:" in p.stdout, p.stdout

    # the control plane counts them (its /metrics, the console's traffic) within a sync
    auth = {"Authorization": f"Bearer {server.admin_token}"}

    def direct_count() -> float:
        text = httpx.get(f"{server.url}/v1/deployments/{MODEL}/metrics", headers=auth).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("deeppod_direct_requests_total{") and 'code="200"' in line)

    wait_until(lambda: direct_count() >= 5, 10, interval=0.1, what="replicas to report their direct predictions")

    # a deployment key's token stops with the key: at the replica's next sync (SYNC_SECONDS, a
    # clock's matter: tests/serve/test_direct.py); here, that it ends at all, whatever the load
    key = c.create_deployment_key(MODEL, "camera")
    grant = Client(server.url, key["key"]).direct_token(MODEL)
    url = grant["replicas"][0]["url"] + "/predict"

    def call(token: str) -> httpx.Response:
        return httpx.post(url, content=images[0], headers={"Authorization": f"Bearer {token}",
                                                           "content-type": "image/png"}, timeout=30)

    assert call(grant["token"]).status_code == 200
    c.revoke_deployment_key(MODEL, key["id"])
    wait_until(lambda: call(grant["token"]).status_code == 401, 30, interval=0.02,
               what="the key's direct token refused")
    refused = call(grant["token"]).json()["error"]
    assert refused["code"] == "token_revoked", refused
    # a forged or foreign token never gets in, and refusals reach the audit log
    body, _, sig = grant["token"].rpartition(".")
    assert call(body + "." + sig[::-1]).status_code == 401
    assert call(server.admin_token).status_code == 401
    wait_until(lambda: any("(direct, token_revoked)" in e["path"] for e in c.audit(failed=True, limit=50)), 10,
               interval=0.1, what="the refusal in the audit log")

    # revoking every direct token of the deployment (the CLI)
    mine = c.direct_token(MODEL)
    assert call(mine["token"]).status_code == 200
    p = run(env, "deploy", "direct", MODEL, "--revoke")
    assert "revoked" in p.stdout
    wait_until(lambda: call(mine["token"]).status_code == 401, 5, interval=0.02, what="revoked direct tokens refused")


def test_bad_input_gets_4xx_and_the_replica_lives(flow):
    server, c = flow["server"], flow["client"]
    c.wait_deployment(MODEL, timeout=120)
    url, auth = f"{server.url}/v1/deployments/{MODEL}/predict", {"Authorization": f"Bearer {server.admin_token}"}
    from PIL import Image

    buf = io.BytesIO()
    Image.effect_noise((256, 256), 60).convert("RGB").save(buf, "JPEG")
    good = buf.getvalue()
    cases = [
        (dict(content=b"this is not an image", headers={**auth, "content-type": "image/jpeg"}), 422, "not an image"),
        (dict(content=good[: len(good) // 2], headers={**auth, "content-type": "image/jpeg"}), 422, "decoded"),
        (dict(content=b"", headers={**auth, "content-type": "image/png"}), 422, "empty"),
        (dict(json={"tensors": [[[0.0] * 5] * 5]}, headers=auth), 422, "[3, 16, 16]"),
        (dict(json={"images": ["@@@"]}, headers=auth), 422, "base64"),
        (dict(json={"pictures": []}, headers=auth), 422, "unknown field"),
        (dict(json={}, headers=auth), 422, "no image"),
        (dict(content=b"{bad json", headers={**auth, "content-type": "application/json"}), 422, "not valid JSON"),
        (dict(content=b"x" * 10, headers={**auth, "content-type": "text/plain"}), 415, "multipart"),
        (dict(content=b"x" * (2 << 20), headers={**auth, "content-type": "image/png"}), 413, "limit"),
        (dict(files=[("image", ("a.png", good))], data={"top_k": "zero"}, headers=auth), 422, "top_k"),
    ]
    for kw, status, words in cases:
        r = httpx.post(url, timeout=30, **kw)
        assert r.status_code == status, (kw.get("json"), r.status_code, r.text)
        assert words in r.json()["error"]["message"], r.text
    r = httpx.post(url, files=[("image", ("a.jpg", good))], headers=auth, timeout=30)
    assert r.status_code == 200 and r.json()["predictions"][0]["label"] in [str(i) for i in range(10)]
    d = c.deployment(MODEL)
    assert d["state"] == "ready" and all(r["restarts"] == 0 for r in d["replica_jobs"])


class Load:
    """Closed-loop clients predicting without pause; every failure is kept."""

    def __init__(self, url: str, token: str, image: bytes, clients: int = 6):
        self.url, self.token, self.image = url, token, image
        self.ok, self.failures, self.versions = 0, [], set()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self):
        with httpx.Client(timeout=60) as h:
            while not self.stop.is_set():
                try:
                    r = h.post(self.url, content=self.image, headers={"Authorization": f"Bearer {self.token}",
                                                                      "content-type": "image/png"})
                    if r.status_code == 200:
                        self.ok += 1
                        self.versions.add(r.json()["version"])
                    else:
                        self.failures.append((r.status_code, r.text[:200]))
                except httpx.HTTPError as exc:
                    self.failures.append(("transport", repr(exc)))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)


def test_rolling_update_and_rollback_under_load_lose_nothing(flow):
    server, c, env = flow["server"], flow["client"], flow["env"]
    c.wait_deployment(MODEL, timeout=120)
    reader = ShardReader(server.home / "data" / "hot" / "default" / "digits" / "v1", "val")
    with Load(f"{server.url}/v1/deployments/{MODEL}/predict", server.admin_token, reader.read(0)[0]) as load:

        def more_answers(n=20):  # the load runs against each version for a while
            seen = load.ok
            wait_until(lambda: load.ok >= seen + n, 60, interval=0.1, what=f"{n} more answers under load")

        more_answers()
        p = run(env, "deploy", "update", MODEL, "--version", "1", timeout=300)
        assert "ready" in p.stdout
        more_answers()
        p = run(env, "deploy", "rollback", MODEL, timeout=300)
        assert "rolling back to" in p.stdout and "ready" in p.stdout
        more_answers()
    assert load.failures == [], load.failures[:5]
    assert load.ok > 50 and load.versions == {1, 2}
    d = c.deployment(MODEL)
    assert d["version"] == 2 and d["previous_version"] == 1 and len(d["replica_jobs"]) == 2
    text = httpx.get(f"{server.url}/v1/deployments/{MODEL}/metrics",
                     headers={"Authorization": f"Bearer {server.admin_token}"}).text
    sizes = [line for line in text.splitlines() if line.startswith("deeppod_batch_size_bucket") and 'le="1"' in line]
    counts = [line for line in text.splitlines() if line.startswith("deeppod_batch_size_count")]
    assert sizes and counts
    # under 6 concurrent clients and 2 replicas, batches of more than one formed
    assert any(float(s.rsplit(" ", 1)[1]) < float(n.rsplit(" ", 1)[1]) for s, n in zip(sizes, counts)), text


def test_a_killed_replica_is_restarted(flow):
    server, c = flow["server"], flow["client"]
    d = c.wait_deployment(MODEL, timeout=120)
    victim = d["replica_jobs"][0]["job_id"]
    pid = JobFolder.of(server.home / "jobs", victim).read_pids()["0"]
    os.kill(pid, 9)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        j = c.job(victim)
        if j["restart_count"] >= 1 and c.deployment(MODEL)["state"] == "ready":
            break
        time.sleep(0.5)
    assert c.job(victim)["restart_count"] >= 1
    assert c.wait_deployment(MODEL, timeout=120)["state"] == "ready"

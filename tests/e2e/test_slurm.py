"""`deeppod server --executor slurm` on a real Slurm (tests/slurm_site.py), as an administrator
starts it (sandboxing as root, the default) and a user submits to it with the CLI: Slurm queues,
places and runs each job as its tenant's identity under the tenant's account."""

import json
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

from deeppod import Client
from tests.helpers import LiveServer, image_archive, wait_until, wheel
from tests.slurm_site import PYTHON, slurm_site

pytestmark = pytest.mark.slow

DDP = """
import json, os
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "CUDA_VISIBLE_DEVICES", "DEEPPOD_JOB_ID",
        "SLURM_JOB_ACCOUNT")
print(json.dumps({**{k: os.environ.get(k) for k in keys}, "sum": t.item(), "uid": os.getuid()}), flush=True)
dist.destroy_process_group()
"""

# a step each 0.1 s, saving its step; a stop (SIGTERM) saves and asks to be resumed. Its first run
# never ends by itself (a stop or a requeue must reach it however slow the machine); a resumed run
# goes on to step 40 and is done
STEPS = """
import os, signal, sys, time
ckpt = os.path.join(os.environ["DEEPPOD_CHECKPOINT_DIR"], "step")
resumed = os.path.exists(ckpt)
step = int(open(ckpt).read()) if resumed else 0
print(f"from step {step}", flush=True)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
while step < 40 or not resumed:
    if stop:
        print(f"saved at step {step}", flush=True)
        sys.exit(75)
    time.sleep(0.1)
    step += 1
    open(ckpt + ".tmp", "w").write(str(step))
    os.replace(ckpt + ".tmp", ckpt)
    print(f"step {step}", flush=True)
print("done", flush=True)
"""


# a search's trial: a score that rises with x, reported each step through the runtime
TRIAL = """
import argparse, math, time
from deeppod import runtime
p = argparse.ArgumentParser()
p.add_argument("--x", type=float)
x = p.parse_args().x
for step in range(4):
    runtime.report(step, score=x * (1 - math.exp(-(step + 1) / 2)))
    time.sleep(0.1)
"""


# a job in its own environment: its package, and the platform's runtime still importable
PROBE = """
import importlib.metadata, os, sys
import deeppod_probe
import deeppod.runtime
print("probe", importlib.metadata.version("deeppod-probe"), deeppod_probe.VALUE, sys.prefix, os.getuid(), flush=True)
"""


@pytest.fixture(scope="module")
def site():
    with slurm_site() as s:
        yield s


@pytest.fixture(scope="module")
def server(site):
    # the server's home is on the "shared file system": a folder the jobs' identities can cross
    where = Path(tempfile.mkdtemp(prefix="deeppod-slurm-server-"))
    where.chmod(0o711)
    (where / "wheels").mkdir()  # the package index jobs' environments are built from (nothing downloaded)
    wheel(where / "wheels", "deeppod-probe", "1.2.3", "pinned")
    (where / "images").mkdir()  # the container images the administrator offers
    image_archive(where / "images", "tiny")
    server = LiveServer(where / "home", isolation=None, extra_env={
        "DEEPPOD_EXECUTOR": "slurm", "DEEPPOD_SLURM_CONF": site.conf, "DEEPPOD_SLURM_PYTHON": PYTHON,
        "DEEPPOD_SLURM_PYTHONPATH": site.pythonpath, "DEEPPOD_ENV_FIND_LINKS": str(where / "wheels"),
        "DEEPPOD_ENV_NO_INDEX": "1", "DEEPPOD_IMAGE_DIR": str(where / "images")}).start()
    try:
        yield server
    finally:
        server.stop()
        server.cleanup_jobs()
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "ddp.py").write_text(textwrap.dedent(DDP))
    (tmp_path / "steps.py").write_text(textwrap.dedent(STEPS))
    (tmp_path / "trial.py").write_text(textwrap.dedent(TRIAL))
    (tmp_path / "space.yaml").write_text("x: {type: float, low: 0.0, high: 1.0}\n")
    (tmp_path / "eat.py").write_text("x = bytearray(900 << 20)\nprint('allocated', flush=True)\n")
    return tmp_path


def submit(server, site, cwd, *args) -> int:
    out = server.cli(cwd, "submit", "--env", f"PYTHONPATH={site.pythonpath}", *args).stdout
    return int(out.split("job ", 1)[1].split()[0].rstrip(":"))


def ended(client, job_id, timeout=120):
    return wait_until(lambda: (j := client.job(job_id))["state"] not in ("queued", "running") and j, timeout,
                      what=f"job {job_id} to end")


def log(client, job_id, rank=0) -> str:
    return b"".join(client.logs(job_id, rank=rank)).decode()


def slurm_job(site, server, job_id) -> str:
    from deeppod.settings import Settings

    name = f"deeppod-{Settings(home=server.home).instance}-{job_id}"
    out = site.cli.run(["squeue", "-h", "--states=all", f"--name={name}", "-o", "%i"])
    return out.split()[0]


def test_a_two_worker_ddp_job_is_one_slurm_job_of_the_tenants_account_as_its_identity(server, site, project):
    plan = project / "plan.yaml"
    plan.write_text("tenants:\n- name: default\n  slurm_account: vision\n")
    server.cli(project, "plan", "apply", str(plan))
    c = Client(server.url, server.admin_token)
    job_id = submit(server, site, project, "--workers", "2", "--gpus-per-worker", "2", "--", PYTHON, "ddp.py")
    job = ended(c, job_id)
    assert job["state"] == "succeeded", (job["reason"], log(c, job_id), log(c, job_id, 1))
    seen = [json.loads(log(c, job_id, r).strip().splitlines()[-1]) for r in (0, 1)]
    assert [s["RANK"] for s in seen] == ["0", "1"] and {s["WORLD_SIZE"] for s in seen} == {"2"}
    assert {s["sum"] for s in seen} == {3.0} and {s["DEEPPOD_JOB_ID"] for s in seen} == {str(job_id)}
    assert sorted(s["CUDA_VISIBLE_DEVICES"] for s in seen) == ["0,1", "2,3"]  # Slurm's GRES, a pair each
    assert {s["SLURM_JOB_ACCOUNT"] for s in seen} == {"vision"}  # the plan's account for the tenant
    uids = {s["uid"] for s in seen}
    assert len(uids) == 1 and uids.isdisjoint({0, os.getuid()})  # the tenant's identity, never the server's
    shown = site.cli.run(["scontrol", "show", "job", slurm_job(site, server, job_id), "-o"])
    uid = uids.pop()
    assert "Account=vision" in shown and f"({uid})" in shown.split("UserId=", 1)[1].split()[0]
    # and Slurm's accounting has it under the account, as the tenant's user (slurmdbd on MariaDB)
    sacct = ["sacct", "-X", "-n", "-P", "-j", slurm_job(site, server, job_id), "-o", "Account,UID,State"]
    assert wait_until(lambda: site.cli.run(sacct).strip() == f"vision|{uid}|COMPLETED", 30, what="sacct's record")
    events = server.cli(project, "job", "events", str(job_id)).stdout
    assert "handed to the cluster's scheduler" in events


def test_slurms_nodes_are_listed_and_a_job_it_holds_back_says_slurms_reason_until_cancelled(server, site, project):
    c = Client(server.url, server.admin_token)
    nodes = server.cli(project, "nodes").stdout
    (node,) = site.cli.run(["sinfo", "-h", "-N", "-o", "%N"]).split()
    assert node in nodes
    cpus = os.cpu_count()
    busy = submit(server, site, project, "--workers", str(cpus), "--gpus-per-worker", "0", "--grace", "1",
                  "--", PYTHON, "-c", "import time; print('busy', flush=True); time.sleep(600)")
    wait_until(lambda: "busy" in log(c, busy), 60, what="the first job to run")
    held = submit(server, site, project, "--gpus-per-worker", "0", "--", PYTHON, "-c", "print('ran')")
    wait_until(lambda: "(Resources)" in (c.job(held).get("phase") or ""), 60, what="Slurm's reason")
    table = server.cli(project, "jobs").stdout
    assert "waiting in Slurm's queue: the nodes it needs are busy (Resources)" in table, table
    server.cli(project, "cancel", str(held))
    server.cli(project, "cancel", str(busy))
    assert ended(c, held)["state"] == "cancelled" and ended(c, busy)["state"] == "cancelled"
    assert "ran" not in log(c, held)
    wait_until(lambda: not site.cli.run(["squeue", "-h", "-o", "%i"]).strip(), 60, what="Slurm's queue to empty")


def test_a_stop_checkpoints_and_a_resume_goes_on_from_there(server, site, project):
    c = Client(server.url, server.admin_token)
    job_id = submit(server, site, project, "--gpus-per-worker", "0", "--", PYTHON, "steps.py")
    wait_until(lambda: "step 5\n" in log(c, job_id), 60, what="the job to take steps")
    (node,) = site.cli.run(["sinfo", "-h", "-N", "-o", "%N"]).split()  # where Slurm put it, on its page too
    wait_until(lambda: [w["node"] for w in c.job(job_id)["allocation"]["workers"]] == [node], 30,
               what="Slurm's node on the job")
    assert f"rank 0 on {node}" in server.cli(project, "job", "events", str(job_id)).stdout
    server.cli(project, "stop", str(job_id))
    assert ended(c, job_id)["state"] == "stopped"
    server.cli(project, "resume", str(job_id))
    job = ended(c, job_id)
    text = log(c, job_id)
    assert job["state"] == "succeeded" and "done" in text, (job, text)
    saved = int(text.split("saved at step ")[1].split()[0])
    assert saved >= 5 and f"from step {saved}" in text


def test_slurms_requeue_resumes_the_same_job_from_its_checkpoint(server, site, project):
    c = Client(server.url, server.admin_token)
    job_id = submit(server, site, project, "--gpus-per-worker", "0", "--", PYTHON, "steps.py")
    wait_until(lambda: "step 5\n" in log(c, job_id), 60, what="the job to take steps")
    slurm_id = slurm_job(site, server, job_id)
    site.cli.run(["scontrol", "requeue", slurm_id])
    # Slurm holds a requeued job back two minutes (its BeginTime); an administrator's word lets it go now
    wait_until(lambda: "(requeued by Slurm)" in (c.job(job_id).get("phase") or ""), 60, what="the requeue to show")
    wait_until(lambda: site.cli.run(["squeue", "-h", "-j", slurm_id, "-o", "%t"]).strip() == "PD", 60,
               what="Slurm to queue it again")
    site.cli.run(["scontrol", "update", f"JobId={slurm_id}", "StartTime=now"])
    job = ended(c, job_id)
    text = log(c, job_id)
    assert job["state"] == "succeeded" and "done" in text, (job, text)
    assert text.count("from step ") == 2 and "from step 0" in text
    again = int(text.rsplit("from step ", 1)[1].split()[0])
    assert again >= 5  # went on from its checkpoint, not from the start
    events = server.cli(project, "job", "events", str(job_id)).stdout
    assert "requeued by Slurm" in events


def test_a_job_whose_node_fails_is_requeued_by_slurm_once_and_resumes_from_its_checkpoint(server, site, project):
    """The node goes DOWN under the running job (as slurmctld marks a node that stops answering):
    Slurm requeues the job (--requeue); DeepPod keeps the one job, says why it waits, and starts no
    second run of its own."""
    c = Client(server.url, server.admin_token)
    job_id = submit(server, site, project, "--gpus-per-worker", "0", "--", PYTHON, "steps.py")
    wait_until(lambda: "step 5\n" in log(c, job_id), 60, what="the job to take steps")
    slurm_id = slurm_job(site, server, job_id)
    node = site.cli.run(["squeue", "-h", "-j", slurm_id, "-o", "%N"]).strip()
    site.cli.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=deeppod test: node lost"])
    wait_until(lambda: "(requeued by Slurm)" in (c.job(job_id).get("phase") or ""), 120, what="the requeue to show")
    assert c.job(job_id)["state"] in ("queued", "running")

    def back() -> bool:
        """What an administrator does once the node is mended, again until the job has run: the
        node back in service (on this one host its slurmd answered at once and may have drained it:
        'Duplicate jobid', the old run not yet gone), the job let go (held after a failed launch),
        its two minutes' BeginTime waived."""
        if c.job(job_id)["state"] not in ("queued", "running") or log(c, job_id).count("from step ") >= 2:
            return True
        for args in ([f"NodeName={node}", "State=RESUME"], [f"JobId={slurm_id}", "StartTime=now"]):
            site.cli.run(["scontrol", "update", *args], check=False)
        site.cli.run(["scontrol", "release", slurm_id], check=False)
        return False

    try:
        wait_until(back, 180, interval=2, what="the job to run again")
    finally:  # the next test finds the node in service, as DeepPod lists it too, whatever happened here
        def mended() -> bool:
            site.cli.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
            return any(n["name"] == node and n["up"] and n["healthy"] and n["cpus"] and not n["down_reason"]
                       for n in c.nodes.list())
        try:
            wait_until(mended, 120, interval=1, what="the node to be back in service")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: Slurm says {site.cli.run(['sinfo', '-N', '-o', '%N %T %E'])}, "
                                 f"DeepPod {c.nodes.list()}, the job {c.job(job_id)}") from None
    job = ended(c, job_id)
    text = log(c, job_id)
    assert job["state"] == "succeeded" and "done" in text, (job, text)
    assert text.count("from step ") == 2 and int(text.rsplit("from step ", 1)[1].split()[0]) >= 5, text
    # one Slurm job ran it both times: DeepPod did not submit it again beside Slurm's requeue
    assert slurm_job(site, server, job_id) == slurm_id
    name = site.cli.run(["squeue", "-h", "--states=all", "-j", slurm_id, "-o", "%j"]).strip()
    assert len(site.cli.run(["squeue", "-h", "--states=all", f"--name={name}", "-o", "%i"]).split()) == 1


def test_a_drained_node_is_listed_down_with_slurms_reason_until_it_is_resumed(server, site, project):
    """What an administrator drains for maintenance: DeepPod places nothing there and says why in
    Slurm's words (`deeppod nodes`, the console's cluster page), and takes it back once resumed."""
    c = Client(server.url, server.admin_token)
    node = site.cli.run(["sinfo", "-h", "-N", "-o", "%N"]).split()[0]

    def listed():
        return next(n for n in c.nodes.list() if n["name"] == node)

    site.cli.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=deeppod test: fan [2] failing"])
    try:
        wait_until(lambda: not listed()["up"], 60, what="the drained node to be listed down")
        assert listed()["down_reason"] == "drained in Slurm: deeppod test: fan [2] failing", listed()
        table = server.cli(project, "-o", "wide", "nodes").stdout
        assert "drained in Slurm: deeppod test: fan [2] failing" in " ".join(table.split()), table
    finally:
        site.cli.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
    wait_until(lambda: listed()["up"] and listed()["down_reason"] is None, 60, what="the node to be back")


def test_a_job_reads_its_dataset_where_deeppod_keeps_it(server, site, project):
    """No sandbox binds it in on Slurm: the job's identity is given the version's folder to read."""
    from deeppod.runtime.trainers.digits import write_digits

    server.cli(project, "data", "ingest", "digits", str(write_digits(project / "digits")), "--split", "val=0.2")
    c = Client(server.url, server.admin_token)
    job_id = submit(server, site, project, "--gpus-per-worker", "0", "--dataset", "digits", "--", PYTHON, "-c",
                    "import os; d = os.environ['DEEPPOD_DATA_DIGITS']; "
                    "print(d, sum(len(open(os.path.join(r, f), 'rb').read()) for r, _, fs in os.walk(d) for f in fs), "
                    "os.getuid(), flush=True)")
    job = ended(c, job_id)
    assert job["state"] == "succeeded", (job["reason"], log(c, job_id))
    where, read, uid = log(c, job_id).strip().splitlines()[-1].split()
    assert int(read) == sum(p.stat().st_size for p in Path(where).rglob("*") if p.is_file()) > 100_000
    assert int(uid) not in (0, os.getuid()) and Path(where).stat().st_uid == os.getuid()  # the server's own files


def test_a_job_runs_in_its_own_python_environment_built_once_before_it_goes_to_slurm(server, site, project):
    (project / "probe.py").write_text(PROBE)
    (project / "requirements.txt").write_text("deeppod-probe==1.2.3\n")
    c = Client(server.url, server.admin_token)
    jobs = [int(server.cli(project, "submit", "--gpus-per-worker", "0", "--requirements", "requirements.txt", "--",
                           "python", "probe.py").stdout.split()[1]) for _ in range(2)]
    done = [ended(c, j, timeout=300) for j in jobs]
    logs = [log(c, j) for j in jobs]
    assert [d["state"] for d in done] == ["succeeded"] * 2, (done, logs)
    key = done[0]["env_key"]
    assert key and done[1]["env_key"] == key and sum("building environment" in text for text in logs) == 1, logs
    for text in logs:  # its own interpreter, as the tenant's identity; the platform's runtime importable beside it
        _, version, value, prefix, uid = text.strip().splitlines()[-1].split()
        assert (version, value) == ("1.2.3", "pinned") and prefix.endswith(f"/{key}"), text
        assert int(uid) not in (0, os.getuid())
    events = server.cli(project, "job", "events", str(jobs[0])).stdout
    assert "preparing environment" in events and "handed to the cluster's scheduler" in events, events
    # a requirement the index does not have: the installer's words, and nothing went to Slurm
    bad = c.submit(["python", "probe.py"], code=str(project), gpus_per_worker=0, requirements=["deeppod-probe==9.9.9"])
    job = ended(c, bad["id"], timeout=300)
    assert job["state"] == "failed" and "could not build its Python environment" in job["reason"], job
    assert "9.9.9" in job["reason"] and not site.cli.run(["squeue", "-h", "--states=all", "-o", "%j"]).count(
        f"-{bad['id']}\n"), job


def test_a_worker_over_its_memory_is_killed_by_slurm_and_the_job_says_so(server, site, project):
    c = Client(server.url, server.admin_token)
    job_id = submit(server, site, project, "--gpus-per-worker", "0", "--memory", "300M", "--", PYTHON, "eat.py")
    job = ended(c, job_id)
    assert job["state"] == "failed" and "ran out of memory" in job["reason"], job


def test_a_search_runs_its_trials_as_slurm_jobs_and_finds_the_best(server, site, project):
    server.cli(project, "tune", "create", "slurm-search", "--space", "space.yaml", "--metric", "score", "--mode", "max",
               "--trials", "3", "--parallel", "2", "--sampler", "random", "--pruner", "none", "--seed", "3",
               "--gpus-per-worker", "0", "--env", f"PYTHONPATH={site.pythonpath}", "--", PYTHON, "trial.py",
               "--x", "{x}")
    c = Client(server.url, server.admin_token)
    done = wait_until(lambda: (e := c.experiment("slurm-search"))["state"] not in ("running", "stopping") and e,
                      180, interval=1, what="the search to end")
    rows = done["trial_table"]
    assert done["state"] == "completed" and [t["state"] for t in rows] == ["completed"] * 3, rows
    top = max(rows, key=lambda t: t["value"])
    assert done["best_trial"] == top["number"] and done["best_params"] == top["params"]
    for t in rows:  # each trial was a Slurm job of its own, and reported from inside it
        assert "handed to the cluster's scheduler" in server.cli(project, "job", "events", str(t["job_id"])).stdout
        assert slurm_job(site, server, t["job_id"]).isdigit()


def test_a_deployment_serves_from_a_replica_slurm_runs_and_one_slurm_ends_is_replaced(server, site, project):
    """A replica is a Slurm job of the tenant's identity that listens on its node's address; the
    router sends predictions there, and a replica Slurm ends (an administrator's scancel) is replaced."""
    import io

    from PIL import Image

    from tests.helpers import image_model

    folder = image_model(server.home / "work" / "default" / "tiny")
    server.cli(project, "models", "register", "tiny", "--path", str(folder))
    out = server.cli(project, "deploy", "tiny").stdout
    assert "tiny@1 ready" in out, out
    c = Client(server.url, server.admin_token)
    picture = io.BytesIO()
    Image.new("RGB", (20, 20), (200, 10, 10)).save(picture, "PNG")
    answer = c.predict("tiny", [picture.getvalue()], top_k=2)
    assert answer["version"] == 1 and answer["predictions"][0]["label"] in {"a", "b", "c", "d"}, answer
    (replica,) = c.deployment("tiny")["replica_jobs"]
    (addr,) = site.cli.run(["sinfo", "-h", "-N", "-o", "%o"]).split()
    assert replica["endpoint"].startswith(f"http://{addr}:"), replica  # its node's address, as Slurm names it
    slurm_id = slurm_job(site, server, replica["job_id"])
    user = site.cli.run(["scontrol", "show", "job", slurm_id, "-o"]).split("UserId=", 1)[1].split()[0]
    assert int(user.split("(")[1].rstrip(")")) not in (0, os.getuid()), user  # the tenant's, never the server's
    site.cli.run(["scancel", slurm_id])
    again = wait_until(lambda: (d := c.deployment("tiny"))["state"] == "ready" and [
        r for r in d["replica_jobs"] if r["job_id"] != replica["job_id"] and r["routed"]], 120,
        what="a new replica to take the traffic")
    assert c.predict("tiny", [picture.getvalue()])["replica"] == str(again[0]["job_id"])
    server.cli(project, "deploy", "rm", "tiny")
    wait_until(lambda: c.job(again[0]["job_id"])["state"] == "cancelled", 60, what="the replica to be cancelled")
    wait_until(lambda: not site.cli.run(["squeue", "-h", "-o", "%i"]).strip(), 60, what="Slurm's queue to empty")


def test_a_job_runs_in_its_container_image_entered_by_its_own_identity(server, site, project):
    """No root on Slurm's nodes to build a sandbox with: each task enters the image in a user
    namespace of its own (executor/rootless.py), as the job's identity."""
    script = ("cat /etc/image-release; echo greeting=$IMAGE_GREETING; echo uid=$(id -u); ls /usr/lib/python3* || "
              "echo no-host-python; touch /etc/mine || echo image-read-only; touch $DEEPPOD_CHECKPOINT_DIR/ok && "
              "echo checkpoints-writable; set -- $DEEPPOD_DATA_DIGITS/*; cat $1 >/dev/null && echo dataset-readable; "
              "echo rank=$RANK world=$WORLD_SIZE")
    c = Client(server.url, server.admin_token)
    if "digits" not in [d["name"] for d in c.datasets()]:
        from deeppod.runtime.trainers.digits import write_digits

        server.cli(project, "data", "ingest", "digits", str(write_digits(project / "digits")), "--split", "val=0.2")
    job = c.submit(["sh", "-c", script], own_folder=True, gpus_per_worker=0, workers=2, image="tiny",
                   datasets=["digits"])
    done = ended(c, job["id"], timeout=300)
    logs = [log(c, job["id"], rank) for rank in (0, 1)]
    assert done["state"] == "succeeded", (done["reason"], logs)
    for out in logs:
        assert "v2\n" in out and "greeting=hello" in out and "no-host-python" in out, out
        assert "image-read-only" in out and "checkpoints-writable" in out and "dataset-readable" in out, out
        assert int(out.split("uid=")[1].split()[0]) not in (0, os.getuid()), out
    assert "rank=1 world=2" in logs[1] and logs[0].count("unpacking image tiny") == 1
    assert "handed to the cluster's scheduler" in server.cli(project, "job", "events", str(job["id"])).stdout

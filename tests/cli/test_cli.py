"""The CLI as a user runs it, against a real server."""

import json
import os
import re
import stat
import subprocess
import sys

import pytest

from deeppod.contract import free_port


@pytest.fixture
def cli(live_server, tmp_path):
    config = tmp_path / "config.json"

    def run(*args, token=None, url=None, check=True, cwd=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
        env["DEEPPOD_CONFIG"] = str(config)
        env["DEEPPOD_HOME"] = str(tmp_path / "nohome")
        env["COLUMNS"] = "200"
        if url is not None:
            env["DEEPPOD_API_URL"] = url
        if token is not None:
            env["DEEPPOD_TOKEN"] = token
        p = subprocess.run([sys.executable, "-m", "deeppod.cli", *args], env=env, capture_output=True, text=True,
                           cwd=cwd or tmp_path, timeout=120)
        if check and p.returncode != 0:
            raise AssertionError(f"deeppod {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    run.config = config
    return run


def test_login_then_everyday_commands(cli, live_server, tmp_path):
    p = cli("login", "--url", live_server.url, "--token", live_server.admin_token)
    assert "logged in" in p.stdout and "admin" in p.stdout
    assert stat.S_IMODE(cli.config.stat().st_mode) == 0o600
    assert json.loads(cli.config.read_text())["url"] == live_server.url
    out = cli("whoami").stdout
    assert "admin (tenant default, admin)" in out and "isolation: single-user; jobs run as the server's" in out

    (tmp_path / "train.py").write_text("import os\nprint('hi', os.environ['RANK'], os.environ['GREETING'])\n")
    p = cli("submit", "--name", "hello", "--workers", "2", "--gpus-per-worker", "1", "--env", "GREETING=hey",
            "-f", "--", sys.executable, "train.py")
    assert "[rank 0] hi 0 hey" in p.stdout and "[rank 1] hi 1 hey" in p.stdout and "succeeded" in p.stdout
    job_id = p.stdout.split()[1]
    assert "hello" in cli("jobs").stdout
    show = cli("job", "show", job_id).stdout
    assert "succeeded" in show and "rank 1: node" in show and "exit codes: rank 0: 0, rank 1: 0" in show
    logged = cli("logs", job_id, "--rank", "1").stdout.splitlines()
    # the platform's own lines first (2 workers of 2 threads on this small machine: why they sleep when idle)
    assert [ln for ln in logged if not ln.startswith("deeppod: ")] == ["hi 1 hey"], logged
    assert "started" in cli("job", "events", job_id).stdout
    listed = json.loads(cli("jobs", "--json").stdout)
    assert listed[0]["id"] == int(job_id)


def test_admin_flow_and_user_isolation(cli, live_server):
    admin = {"url": live_server.url, "token": live_server.admin_token}
    cli("tenants", "create", "vision", **admin)
    p = cli("users", "create", "ana", "--tenant", "vision", **admin)
    ana_token = p.stdout.split("token (shown once): ")[1].strip()
    ana = {"url": live_server.url, "token": ana_token}
    assert "ana (tenant vision, member)" in cli("whoami", **ana).stdout
    p = cli("tenants", "create", "nope", check=False, **ana)
    assert p.returncode == 2 and "only an administrator" in p.stderr
    p = cli("tokens", "create", "--name", "laptop", **ana)
    assert "for ana" in p.stdout
    assert "laptop" in cli("tokens", "ls", **ana).stdout
    assert json.loads(cli("jobs", "--json", **ana).stdout) == []


def test_bad_input_messages(cli, live_server, tmp_path):
    admin = {"url": live_server.url, "token": live_server.admin_token}
    p = cli("submit", "--", "no-such-program-42", check=False, **admin)
    assert p.returncode == 2 and "was not found" in p.stderr
    p = cli("submit", "--workers", "0", "--", sys.executable, "-c", "1", check=False, **admin)
    assert p.returncode == 2 and "workers" in p.stderr
    p = cli("submit", "--workers", "2", "--gpus-per-worker", "4", "--", sys.executable, "-c", "1", check=False, **admin)
    assert p.returncode == 2 and "whole cluster has 4" in p.stderr
    p = cli("submit", "--env", "NOEQUALS", "--", sys.executable, check=False, **admin)
    assert p.returncode == 2 and "KEY=VALUE" in p.stderr
    p = cli("job", "show", "99999", check=False, **admin)
    assert p.returncode == 2 and "no job with id 99999" in p.stderr
    p = cli("jobs", check=False, token="dp_bad", url=live_server.url)
    assert p.returncode == 2 and "unknown or revoked" in p.stderr
    p = cli("jobs", check=False, token="x", url=f"http://127.0.0.1:{free_port()}")
    assert p.returncode == 1 and "cannot reach the DeepPod server" in p.stderr


def test_plan_apply_show_and_bad_plans(cli, live_server, tmp_path):
    admin = {"url": live_server.url, "token": live_server.admin_token}
    cli("tenants", "create", "team-x", **admin)
    (tmp_path / "plan.yaml").write_text("tenants:\n  - name: team-x\n    guaranteed: 2\n    max: 3\n    weight: 2\n")
    p = cli("plan", "apply", str(tmp_path / "plan.yaml"), **admin)
    assert "plan applied" in p.stdout and "team-x" in p.stdout and "(surplus: service)" in p.stdout
    shown = cli("plan", "show", **admin).stdout
    assert "GUARANTEED" in shown and "team-x" in shown and "least attained service" in shown
    (tmp_path / "share.yaml").write_text("tenants:\n  - name: team-x\n    guaranteed: 2\nsurplus: share\n")
    assert "(surplus: share)" in cli("plan", "apply", str(tmp_path / "share.yaml"), **admin).stdout
    (tmp_path / "burst.yaml").write_text("tenants:\n  - name: team-x\nburst:\n  - {name: cloud, gpus: 1, max_nodes: 2, "
                                         "cost_per_hour: 3, tenants: [team-x]}\n")
    p = cli("plan", "apply", str(tmp_path / "burst.yaml"), **admin)
    assert "warning:" in p.stdout and "bursting needs --executor ray" in p.stdout  # one machine adds no nodes
    burst = json.loads(cli("nodes", "burst", "--json", **admin).stdout)
    assert [(t["name"], t["nodes_up"], t["cost_per_hour"]) for t in burst["types"]] == [("cloud", 0, 3.0)]
    assert burst["charges"] == [] and "BURST TYPE" in cli("nodes", "burst", **admin).stdout
    (tmp_path / "bad.yaml").write_text("tenants:\n  - name: team-x\n    guaranteed: 99\n")
    p = cli("plan", "apply", str(tmp_path / "bad.yaml"), check=False, **admin)
    assert p.returncode == 2 and "cluster has 4" in p.stderr
    (tmp_path / "broken.yaml").write_text("tenants: [\n")
    p = cli("plan", "apply", str(tmp_path / "broken.yaml"), check=False, **admin)
    assert p.returncode == 2 and "not valid YAML" in p.stderr
    assert "team-x" in json.loads(cli("plan", "show", "--json", **admin).stdout)["plan"]["tenants"][0]["name"]


def test_elastic_submit_and_cordon(cli, live_server, tmp_path):
    admin = {"url": live_server.url, "token": live_server.admin_token}
    p = cli("submit", "--workers", "1:3", "--gpus-per-worker", "1", "--time", "1-12:00:00", "--", sys.executable,
            "-c", "print(1)", **admin)
    job_id = p.stdout.split()[1]
    job = json.loads(cli("job", "show", job_id, "--json", **admin).stdout)
    assert (job["workers"], job["max_workers"], job["time_limit_seconds"]) == (1, 3, 129600)
    assert "time:      at most 36h a run" in cli("job", "show", job_id, **admin).stdout
    p = cli("submit", "--time", "90", "--", sys.executable, check=False, **admin)
    assert p.returncode == 2 and "--time '90' is not a time limit: use e.g. 90m" in p.stderr
    p = cli("submit", "--workers", "3:1", "--", sys.executable, check=False, **admin)
    assert p.returncode == 2 and "max_workers" in p.stderr
    p = cli("submit", "--workers", "x", "--", sys.executable, check=False, **admin)
    assert p.returncode == 2 and "MIN:MAX" in p.stderr
    node = json.loads(cli("nodes", "--json", **admin).stdout)[0]["name"]
    cli("nodes", "cordon", node, "--gpu", "3", **admin)
    shown = cli("nodes", **admin).stdout
    assert "(sick GPUs: 3)" in shown and "GPUS FREE" in shown and "CPUS USED" in shown
    cli("nodes", "uncordon", node, "--gpu", "3", **admin)
    assert "sick" not in cli("nodes", **admin).stdout
    p = cli("nodes", "cordon", "no-such-node", check=False, **admin)
    assert p.returncode == 2 and "no node named" in p.stderr


def test_sim_command(cli, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
        f"2017-11-06 00:{i:02d}:00,600,{1 + i % 4},0,{'ab'[i % 2]}\n" for i in range(40)))
    out = tmp_path / "r.json"
    p = cli("sim", "--trace", str(trace), "--nodes", "2", "--out", str(out), "--plot", str(tmp_path / "p.png"))
    assert "jct_avg_h" in p.stdout and json.loads(out.read_text())["completed"] == 40
    assert (tmp_path / "p.png").stat().st_size > 1000
    p = cli("sim", "--trace", str(tmp_path / "missing.csv"), check=False)
    assert p.returncode == 2 and "does not exist" in p.stderr


REPORTING_JOB = """
import time
from deeppod import runtime
ctx = runtime.init()
for step in range(30):
    runtime.report(step, loss=1.0 / (step + 1), accuracy=step / 30)
runtime.metrics.reporter().flush()
print("reported", flush=True)
while not runtime.should_stop():
    time.sleep(0.1)
print("stopping", flush=True)
runtime.exit_for_resume()
"""


def test_metrics_and_stop(cli, live_server, tmp_path):
    admin = {"url": live_server.url, "token": live_server.admin_token}
    (tmp_path / "job.py").write_text(REPORTING_JOB)
    p = cli("submit", "--", sys.executable, "job.py", **admin)
    job_id = p.stdout.split()[1]
    from tests.helpers import wait_until

    wait_until(lambda: "reported" in cli("logs", job_id, **admin).stdout, 60)
    table = cli("metrics", job_id, **admin).stdout
    assert "loss" in table and "accuracy" in table and "▁" in table and "█" in table
    data = json.loads(cli("metrics", job_id, "--json", **admin).stdout)
    assert data["metrics"]["loss"]["points"] == 30
    assert "stopping" in cli("stop", job_id, **admin).stdout
    wait_until(lambda: json.loads(cli("job", "show", job_id, "--json", **admin).stdout)["state"] == "stopped", 60)
    assert "stopping" in cli("logs", job_id, **admin).stdout
    p = cli("stop", job_id, check=False, **admin)
    assert p.returncode == 2 and "already ended" in p.stderr
    assert "resumes from its checkpoint" in cli("resume", job_id, **admin).stdout
    wait_until(lambda: cli("logs", job_id, **admin).stdout.count("reported") == 2, 60)  # it ran again
    cli("stop", job_id, **admin)
    wait_until(lambda: json.loads(cli("job", "show", job_id, "--json", **admin).stdout)["state"] == "stopped", 60)


def test_bench_train_runs(cli):
    p = cli("bench", "train", "--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--steps", "2",
            "--workers", "2", "--json")
    r = json.loads(p.stdout)
    assert r["n_workers"]["workers"] == 2 and r["n_workers"]["images_per_second_total"] > 0
    assert 0 < r["scaling_efficiency"] and r["n_workers"]["checkpoint_bytes"] > 1_000_000


def _plain_cli(*args, env_extra, cwd, columns="200"):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"COLUMNS": columns, **env_extra})
    return subprocess.run([sys.executable, "-m", "deeppod.cli", *args], env=env, capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_the_cli_finds_a_local_server_on_any_port(live_server, tmp_path):
    # by DEEPPOD_HOME alone: no --url, no token, no login
    p = _plain_cli("whoami", env_extra={"DEEPPOD_HOME": str(live_server.home),
                                         "DEEPPOD_CONFIG": str(tmp_path / "c.json")}, cwd=tmp_path)
    assert p.returncode == 0 and "admin (tenant default, admin)" in p.stdout, p.stderr
    assert f"at {live_server.url}" in p.stdout  # which server answered: another may run on this machine
    # with no DEEPPOD_HOME at all: the one server this user runs (found through its DEEPPOD_CONFIG folder)
    p = _plain_cli("whoami", env_extra={"DEEPPOD_CONFIG": str(live_server.home / "client.json"),
                                         "HOME": str(tmp_path)}, cwd=tmp_path)
    assert p.returncode == 0 and "admin (tenant default, admin)" in p.stdout, p.stderr


def test_jobs_filters_version_and_a_narrow_terminal(cli, live_server, tmp_path):
    admin = {"url": live_server.url, "token": live_server.admin_token}
    assert cli("--version").stdout.strip().startswith("deeppod 0.")
    cli("submit", "--name", "alpha-run", "--gpus-per-worker", "0", "-f", "--", sys.executable, "-c", "pass", **admin)
    cli("submit", "--name", "beta-run", "--gpus-per-worker", "0", "-f", "--", sys.executable, "-c", "pass", **admin)
    names = [j["name"] for j in json.loads(cli("jobs", "--json", "--name", "alpha", **admin).stdout)]
    assert set(names) == {"alpha-run"}
    assert json.loads(cli("jobs", "--json", "--user", "nobody", **admin).stdout) == []
    assert json.loads(cli("jobs", "--json", "--kind", "serve", **admin).stdout) == []
    p = cli("jobs", "--kind", "bogus", check=False, **admin)
    assert p.returncode == 2 and "unknown job kind 'bogus'" in p.stderr
    listed = json.loads(cli("jobs", "--json", "--tenant", "default", **admin).stdout)
    assert {"alpha-run", "beta-run"} <= {j["name"] for j in listed} and all(j["kind"] == "batch" for j in listed)
    env = {"DEEPPOD_API_URL": live_server.url, "DEEPPOD_TOKEN": live_server.admin_token}
    narrow = _plain_cli("jobs", "--name", "-run", env_extra=env, cwd=tmp_path, columns="80").stdout
    lines = narrow.splitlines()
    assert lines[0].split()[0] == "ID" and all(len(line) <= 80 for line in lines)
    ids = {str(j["id"]) for j in listed if j["name"].endswith("-run")}
    assert ids <= {line.split()[0] for line in lines[1:] if line.strip()}


def test_trainer_mistakes_are_refused_at_submit_with_the_choices(cli, live_server, tmp_path):
    admin = {"url": live_server.url, "token": live_server.admin_token}
    (tmp_path / "imgs" / "cat").mkdir(parents=True)
    before = len(json.loads(cli("jobs", "--json", "--all", **admin).stdout))
    base = ("train", "image-classifier", "--data", str(tmp_path / "imgs"))
    p = cli(*base, "--model", "resnet5", check=False, **admin)
    assert p.returncode == 2 and "resnet50" in p.stderr and "small-cnn" in p.stderr
    p = cli(*base, "--optimizer", "adamx", check=False, **admin)
    assert p.returncode == 2 and "adamw" in p.stderr
    p = cli(*base, "--lr-schedule", "wavy", check=False, **admin)
    assert p.returncode == 2 and "linear-warmup-cosine" in p.stderr
    p = cli(*base, "--grace", "-1", check=False, **admin)
    assert p.returncode == 2 and "grace_seconds" in p.stderr, p.stderr
    p = cli(*base, "--time", "12", check=False, **admin)
    assert p.returncode == 2 and "--time '12' is not a time limit" in p.stderr, p.stderr
    p = cli("train", "image-classifier", "--dataset", "nosuch", check=False, **admin)
    assert p.returncode == 2 and "no such dataset" in p.stderr and "deeppod data ingest" in p.stderr
    assert len(json.loads(cli("jobs", "--json", "--all", **admin).stdout)) == before  # nothing submitted
    helptext = cli("train", "image-classifier", "--help").stdout
    assert "--register" in helptext and "--image-size" in helptext and "default: 1 when the cluster" in helptext
    assert "--time" in helptext
    assert cli("tokens", "current", **admin).stdout.strip() == live_server.admin_token


def test_sim_scale_replays_k_copies_on_a_cluster_k_times_the_size(cli, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
        f"2017-11-06 00:{i:02d}:00,600,{1 + i % 4},0,{'ab'[i % 2]}\n" for i in range(40)))
    out = tmp_path / "r.json"
    p = cli("sim", "--trace", str(trace), "--nodes", "2", "--scale", "3", "--out", str(out))
    r = json.loads(out.read_text())
    assert r["jobs"] == r["completed"] == 120 and r["cluster"]["gpus"] == 48
    assert set(r["guarantee_by_tenant"]) == {"a", "b", "a~1", "b~1", "a~2", "b~2"}
    assert "round_ms_p99" in p.stdout and "48" in p.stdout
    p = cli("sim", "--trace", str(trace), "--scale", "0", check=False)
    assert p.returncode == 2 and "--scale 0" in p.stderr


def test_access_keys_and_an_empty_inbox_commit(cli, live_server, tmp_path, monkeypatch):
    admin = {"url": live_server.url, "token": live_server.admin_token}
    made = json.loads(cli("keys", "create", "--name", "camera", "--scope", "read", "--json", **admin).stdout)
    assert made["key_id"].startswith("DPK") and made["scope"] == "read" and made["endpoint"].endswith("/s3")
    listed = cli("keys", "ls", **admin).stdout
    assert made["key_id"] in listed and "camera" in listed and made["secret"] not in listed
    assert "revoked" in cli("keys", "revoke", made["key_id"], **admin).stdout
    p = cli("keys", "revoke", "DPKNOSUCH", check=False, **admin)
    assert p.returncode == 2 and "deeppod keys ls" in p.stderr
    # written as an AWS profile: the aws CLI needs no flags; a taken name is refused before a key is made
    creds, config = tmp_path / "aws" / "credentials", tmp_path / "aws" / "config"
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    config.parent.mkdir()
    config.write_text("[default]\nregion = eu-west-1\n")  # someone's own settings stay as they were
    p = cli("keys", "create", "--name", "lab", "--aws-profile", "lab", **admin)
    assert "aws --profile lab s3 ls" in p.stdout and oct(creds.stat().st_mode & 0o777) == "0o600"
    assert config.read_text().startswith("[default]\nregion = eu-west-1\n")
    aws = subprocess.run([sys.executable, "-m", "awscli", "--profile", "lab", "s3", "ls"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "AWS_SHARED_CREDENTIALS_FILE": str(creds),
                                                      "AWS_CONFIG_FILE": str(config)})
    assert aws.returncode == 0 and "datasets" in aws.stdout, aws.stderr
    keys = len(json.loads(cli("keys", "ls", "--json", **admin).stdout))
    p = cli("keys", "create", "--aws-profile", "lab", check=False, **admin)
    assert p.returncode == 2 and "exists already" in p.stderr
    assert len(json.loads(cli("keys", "ls", "--json", **admin).stdout)) == keys
    p = cli("data", "commit", "nothing-here", check=False, **admin)
    assert p.returncode == 2
    assert "inbox of 'nothing-here' is empty" in p.stderr and "s3://inbox/nothing-here/" in p.stderr


def test_size_measures_the_rate_here_when_asked(cli):
    p = cli("size", "--images", "10000", "--epochs", "1", "--hours", "1", "--measure", "resnet18",
            "--measure-batch", "2", "--measure-steps", "2", "--no-simulate", "--json")
    r = json.loads(p.stdout)
    assert r["why"][0].startswith("measured here: resnet18, batch 2 per worker") and r["job_gpus"] >= 1
    rate = float(r["why"][0].split(": ")[-1].split(" images/s")[0].replace(",", ""))
    shown = float(re.split(r" GPUs? at ", r["why"][1])[1].split(" images/s")[0].replace(",", ""))
    assert rate > 0 and abs(shown - rate) <= 1  # the sizing used the rate measured
    p = cli("size", "--images", "10000", "--epochs", "1", "--hours", "1", check=False)
    assert p.returncode == 2 and "--images-per-gpu" in p.stderr and "--measure" in p.stderr


def test_size_says_what_a_workload_needs_and_why(cli):
    p = cli("size", "--images", "1281167", "--epochs", "90", "--hours", "24", "--images-per-gpu", "2900",
            "--users", "10", "--runs-per-user-day", "0.5", "--wait-minutes", "60", "--json")
    r = json.loads(p.stdout)
    assert r["gpus"] == r["training_gpus"] >= 3 and r["cpus_per_gpu"] == 6 and len(r["why"]) >= 4
    p = cli("size", "--images", "1281167", "--epochs", "90", "--hours", "24", "--images-per-gpu", "2900",
            "--users", "10", "--runs-per-user-day", "0.5", "--wait-minutes", "60")
    table = p.stdout.split("simulated waits for GPUs, by the cluster's size:\n")[1].split("why:")[0].splitlines()
    assert table[0].split() == ["GPUS", "P95", "WAIT", "(MIN)", "MEAN", "WAIT", "(MIN)"]
    chosen = [row.split()[0] for row in table[1:] if row.rstrip().endswith("<- chosen")]
    assert chosen == [str(r["training_gpus"])] and len(table) - 1 == len(r["waits"])
    p = cli("size", "--images", "100", "--epochs", "1", "--hours", "1", "--images-per-gpu", "100",
            "--inference-rps", "5", check=False)
    assert p.returncode == 2 and "--rps-per-gpu" in p.stderr


def test_gpu_memory_and_time_from_submit_and_tune_reach_their_jobs(cli, live_server, tmp_path):
    from deeppod import Client
    from tests.helpers import wait_until

    admin = {"url": live_server.url, "token": live_server.admin_token}
    p = cli("submit", "--gpu-memory", "8G", "--", sys.executable, "-c", "print(1)", **admin)
    job = json.loads(cli("job", "show", p.stdout.split()[1], "--json", **admin).stdout)
    assert job["gpu_memory_mb"] == 8192  # the live server's logical slots say no memory: any request fits
    (tmp_path / "space.yaml").write_text("lr: {type: float, low: 0.001, high: 0.1, log: true}\n")
    cli("tune", "create", "gm", "--space", str(tmp_path / "space.yaml"), "--trials", "1", "--parallel", "1",
        "--gpu-memory", "8G", "--time", "45m", "--prune-after", "3", "--", sys.executable, "-c", "print({lr})",
        **admin)
    c = Client(live_server.url, live_server.admin_token)
    assert c.experiment("gm")["prune_after"] == 3  # asha's first rung at step 3
    assert "asha pruner from step 3" in cli("tune", "show", "gm", **admin).stdout

    def trial():
        return next((j for j in c.jobs() if j["kind"] == "trial"), None)

    wait_until(trial, 60, what="the search's first trial")
    assert trial()["gpu_memory_mb"] == 8192 and trial()["time_limit_seconds"] == 2700


def test_notebook_start_ls_stop_and_resume(cli, live_server):
    """`deeppod notebook`: what to open, the table, a stop that keeps it, --resume; bad input said."""
    from tests.helpers import wait_until

    admin = {"url": live_server.url, "token": live_server.admin_token}
    p = cli("notebook", "start", "--idle", "forever", check=False, **admin)
    assert p.returncode != 0 and "--idle" in p.stderr
    said = cli("notebook", "start", "--gpus-per-worker", "0", "--idle", "45m", "--name", "explore", **admin).stdout
    nb_id = int(re.search(r"notebook (\d+) \(explore\)", said).group(1))
    assert f"open {live_server.url}/notebooks/{nb_id}/lab" in said and "after 45m" in said
    assert f"--resume {nb_id}" in said
    wait_until(lambda: f"{live_server.url}/notebooks/{nb_id}/lab" in cli("notebook", "ls", **admin).stdout, 120,
               what="the notebook to run")
    row = next(line for line in cli("notebook", "ls", **admin).stdout.splitlines() if "explore" in line)
    assert "running" in row and "45m" in row
    p = cli("notebook", "start", "--resume", str(nb_id), "--gpus-per-worker", "1", check=False, **admin)
    assert p.returncode != 0 and "leave out --gpus-per-worker" in p.stderr
    assert f"--resume {nb_id}" in cli("notebook", "stop", str(nb_id), **admin).stdout
    wait_until(lambda: json.loads(cli("notebook", "ls", "--json", **admin).stdout)[0]["state"] == "stopped", 60)
    assert "queued" in cli("notebook", "start", "--resume", str(nb_id), **admin).stdout
    cli("notebook", "stop", str(nb_id), **admin)


def test_a_jsonl_file_ingests_as_a_text_dataset(cli, live_server, tmp_path):
    admin = {"url": live_server.url, "token": live_server.admin_token}
    src = tmp_path / "train.jsonl"
    src.write_text("\n".join([json.dumps({"prompt": f"{i}+{i}=", "completion": str(2 * i)}) for i in range(20)]
                             + [json.dumps({"prompt": "0+0=", "completion": "0"}), '{"prompt": 1}']) + "\n")
    out = cli("data", "ingest", "sums", str(src), "--split", "val=0.1", **admin).stdout
    assert "sums@1: 20 prompt-completion examples" in out and "1 duplicate line(s) dropped" in out, out
    assert "split: train 18, val 2" in out and "1 line(s) quarantined" in out
    assert "train.jsonl:22: 'prompt' is not a string" in out
    shown = cli("data", "show", "sums@1", **admin).stdout
    assert "sums@1: 20 prompt-completion examples" in shown and "duplicates dropped: 1" in shown
    from tests.models.hf_folder import write_tiny_llama
    folder = write_tiny_llama(tmp_path / "tiny")
    cli("models", "register", "tiny", "--path", str(folder), **admin)
    counted = cli("data", "tokens", "sums@1", "--model", "tiny@1", **admin).stdout
    assert "sums@1 in tiny@1's tokens:" in counted and "all fit its 128-token context" in counted, counted
    p = cli("data", "tokens", "sums@1", "--model", "nosuch@1", check=False, **admin)
    assert p.returncode != 0 and "nosuch" in p.stderr

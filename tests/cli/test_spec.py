"""--spec FILE.yaml: every option of submit and tune create as a field, options beside it win,
paths read from the file's folder; and the file a job's spec (jobs/spec.py) writes submits the
same job again."""

import sys
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from deeppod.cli import experiments, jobs
from deeppod.cli.main import app
from deeppod.job_spec import FIELDS
from deeppod.jobs.spec import spec_text


class FakeClient:
    """Records what the CLI sends through client.jobs.submit and client.experiments.create."""

    def __init__(self):
        self.sent = []
        self.jobs = SimpleNamespace(submit=self.submit)
        self.experiments = SimpleNamespace(create=self.create_experiment)

    def submit(self, command, **kw):
        self.sent.append({"command": command, **kw})
        return {"id": 7, "name": kw.get("name") or "x", "state": "queued", "warning": None}

    def create_experiment(self, name, command, **kw):
        self.sent.append({"name": name, "command": command, **kw})
        return {"id": 3, "name": name, "state": "running", **{k: kw[k] for k in ("trials", "parallel", "sampler",
                                                                                 "pruner")}}


@pytest.fixture
def fake(monkeypatch):
    c = FakeClient()
    monkeypatch.setattr(jobs, "client", lambda *a, **k: c)
    monkeypatch.setattr(experiments, "client", lambda *a, **k: c)
    return c


def run(*args):
    return CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "200"})


def test_a_spec_gives_every_option_and_paths_are_read_from_its_folder(fake, tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "requirements.txt").write_text("numpy\n")
    (folder / "job.yaml").write_text(
        "name: resnet\ncommand: python train.py --epochs 3\nworkers: '1:3'\ngpus-per-worker: 0\n"
        "cpus_per_worker: 2\nmemory: 4G\nrequirements: requirements.txt\nenv: {SEED: 1, MODE: fast}\n"
        "preemptible: false\nstop-patience: val_loss:3\npriority: 5\n")
    monkeypatch.chdir(tmp_path)  # not the spec's folder: its relative paths are still its own
    r = run("submit", "--spec", "project/job.yaml")
    assert r.exit_code == 0, r.output
    sent = fake.sent[0]
    assert sent["command"] == ["python", "train.py", "--epochs", "3"] and sent["name"] == "resnet"
    assert (sent["workers"], sent["max_workers"], sent["gpus_per_worker"]) == (1, 3, 0)
    assert sent["cpus_per_worker"] == 2.0 and sent["memory_mb_per_worker"] == 4096 and sent["priority"] == 5
    assert sent["requirements"] == "numpy\n" and sent["preemptible"] is False
    assert sent["env"]["SEED"] == "1" and sent["env"]["MODE"] == "fast"
    assert sent["stop_rules"] == [{"kind": "plateau", "metric": "val_loss", "patience": 3, "mode": "min"}]


def test_options_beside_the_spec_win_over_its_fields(fake, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("command: [python, a.py]\nworkers: 2\npriority: 1\n")
    assert run("submit", "--workers", "3", "--spec", str(spec), "--", "python", "b.py").exit_code == 0
    assert fake.sent[0]["command"] == ["python", "b.py"] and fake.sent[0]["workers"] == 3
    assert fake.sent[0]["priority"] == 1  # what was not given beside it stays the file's


@pytest.mark.parametrize("text, message", [
    ("gpu-per-worker: 1\ncommand: [x]\n", "'gpu-per-worker' is not a field of this command (did you mean "
                                           "'gpus-per-worker'?)"),
    ("token: abc\ncommand: [x]\n", "'token' is not a field of this command"),  # where and as whom: not in a file
    ("- a\n- b\n", "must hold a mapping of fields"),
    ("command: [x]\nworkers: {a: 1}\n", "'workers' must be one value"),
    ("command: [x\n", "is not valid YAML"),
    ("command: [x]\nrequirements: [numpy, -r /etc/shadow]\n", "requirements line 2 ('-r /etc/shadow') is not a "
                                                             "package requirement"),
])
def test_a_bad_spec_is_refused_with_what_to_fix_and_nothing_is_sent(fake, tmp_path, text, message):
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    r = CliRunner().invoke(app, ["submit", "--spec", str(spec)], env={"COLUMNS": "200"})
    assert r.exit_code != 0 and fake.sent == []
    assert message in str(r.exception or "") + r.output, (r.output, r.exception)


def test_a_search_spec_carries_its_space_inline(fake, tmp_path):
    spec = tmp_path / "search.yaml"
    spec.write_text("command: python train.py --lr {lr}\nspace: {lr: {type: float, low: 0.001, high: 0.1, log: true}}\n"
                    "trials: 8\nparallel: 2\nmetric: val_loss\nmode: min\n")
    r = run("tune", "create", "lr-search", "--spec", str(spec))
    assert r.exit_code == 0, r.output
    sent = fake.sent[0]
    assert sent["space"] == {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}}
    assert (sent["trials"], sent["parallel"], sent["metric"], sent["mode"]) == (8, 2, "val_loss", "min")


def _job(**kw):
    base = dict(id=12, name="resnet", kind="batch", command=[sys.executable, "train.py", "--lr", "0.1"],
                workers=2, max_workers=4, gpus_per_worker=1, cpus_per_worker=4.0, memory_mb_per_worker=8192,
                gpu_memory_mb=40960, pids_per_worker=512, requirements="numpy==2.1\n\ntqdm\n", python="3.11",
                image=None, network="isolated", workdir="/srv/work/red/resnet", priority=3, grace_seconds=45.0,
                time_limit_seconds=129600.0, preemptible=False, max_restarts=2,
                env={"PATH": "/usr/bin", "WANDB_KEY": "secret"},
                stop_rules=[{"kind": "nan", "metric": "loss"},
                            {"kind": "plateau", "metric": "val_acc", "patience": 4, "mode": "max"}],
                datasets=[{"ref": "mnist@2", "version_id": 4, "env": "DEEPPOD_DATA_MNIST"}, "red/cifar"],
                models=[{"ref": "llama-tiny@3", "version_id": 9, "env": "DEEPPOD_MODEL_LLAMA_TINY", "path": "/m/v3"}])
    return SimpleNamespace(**{**base, **kw})


def test_a_jobs_spec_submits_the_same_job_again(fake, tmp_path):
    job = _job()
    text = spec_text(job, own_code_dir="/home/deeppod/jobs/12/code")
    assert "secret" not in text and "-e WANDB_KEY=..." in text  # env values are never shown back
    spec = tmp_path / "job-12.yaml"
    spec.write_text(text)
    assert run("submit", "--spec", str(spec)).exit_code == 0
    sent = fake.sent[0]
    assert sent["command"] == job.command and sent["name"] == job.name
    assert (sent["workers"], sent["max_workers"], sent["gpus_per_worker"], sent["cpus_per_worker"]) == (2, 4, 1, 4.0)
    assert (sent["memory_mb_per_worker"], sent["gpu_memory_mb"], sent["pids_per_worker"]) == (8192, 40960, 512)
    assert sent["requirements"] == "numpy==2.1\ntqdm\n" and sent["python"] == "3.11"
    assert (sent["network"], sent["workdir"], sent["priority"]) == ("isolated", job.workdir, 3)
    assert (sent["grace_seconds"], sent["preemptible"], sent["max_restarts"]) == (45.0, False, 2)
    assert sent["time_limit_seconds"] == 129600.0 and "time: 36h" in text
    assert sent["stop_rules"] == [{"kind": "nan", "metric": "loss"},
                                  {"kind": "plateau", "metric": "val_acc", "patience": 4, "mode": "max"}]
    assert sent["datasets"] == ["mnist@2", "red/cifar"]  # the versions pinned at submit, by their refs
    assert sent["models"] == ["llama-tiny@3"] and "/m/v3" not in text
    # every field of a job is written and read back, but its code (a new submit sends its own)
    # and the image left at none here
    assert set(FIELDS) - set(sent) - {"code"} == set() and sent["image"] is None


def test_a_job_that_ran_in_its_own_folder_leaves_workdir_out(tmp_path):
    text = spec_text(_job(workdir="/home/deeppod/jobs/12/code", max_workers=None),
                     own_code_dir="/home/deeppod/jobs/12/code")
    assert "workdir" not in text and "workers: 2\n" in text

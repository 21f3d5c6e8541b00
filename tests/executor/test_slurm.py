"""The Slurm executor on a real Slurm (tests/slurm_site.py)."""

import json
import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from deeppod.contract import worker_env
from deeppod.errors import ExecutorError
from deeppod.executor.base import LaunchSpec, WorkerSpec
from deeppod.executor.slurm import (
    SlurmExecutor,
    fields,
    gpus_of,
    hostnames,
    node_reason,
    placed,
    site_python,
    waiting_reason,
)
from deeppod.executor.slurm_task import node_addr, parse_node_addrs, task_env, tasks_per_node
from deeppod.job_folder import JobFolder
from tests.helpers import wait_until
from tests.slurm_site import PYTHON, slurm_site

pytestmark = pytest.mark.slow

NOBODY = 65534  # the job's identity: never the server's
PYTHONPATH = ""  # set by the slurm fixture


@pytest.fixture(scope="module")
def slurm():
    global PYTHONPATH
    with slurm_site() as site:
        PYTHONPATH = site.pythonpath
        yield site.cli


@pytest.fixture
def place():
    """A folder the job's identity can reach (pytest's own are 0700, root's)."""
    path = Path(tempfile.mkdtemp(prefix="deeppod-slurm-job-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def executor(cli):
    return SlurmExecutor(cli, python=PYTHON, pythonpath=PYTHONPATH)


def launch(ex, place, script, *, workers=1, gpus=0, memory=None, grace=10.0, job_id=1, run="r1", time_limit=None,
           binds=(), env=None):
    work = place / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, NOBODY, NOBODY)
    (work / "w.py").write_text(textwrap.dedent(script))
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": PYTHONPATH}
    specs = [WorkerSpec(r, "?", worker_env(base, {}, job_id=job_id, rank=r, world_size=workers, local_rank=0,
                                           local_world_size=1, node_rank=0, master_addr="decided-by-slurm",
                                           master_port=1, gpus=(), cpus=1,
                                           checkpoint_dir=str(work), api_url="", token="t"))
             for r in range(workers)]
    spec = LaunchSpec(job_id=job_id, job_dir=place / "job", command=["python" if env else PYTHON, "w.py"],
                      workdir=str(work),
                      workers=specs, grace_seconds=grace, memory_mb_per_worker=memory, gpus_per_worker=gpus,
                      sandbox={"uid": NOBODY, "gid": NOBODY, "binds": [[b, b, False] for b in binds]}, run=run,
                      time_limit_seconds=time_limit, env=env)
    return ex.launch(spec)


def ended(ex, handle, timeout=60):
    return wait_until(lambda: (st := ex.poll(handle)).finished and st, timeout, what="the Slurm job to end")


def test_two_workers_meet_with_the_contract_slurm_binds_each_its_gpus_and_run_as_the_jobs_identity(slurm, place):
    ex = executor(slurm)
    h = launch(ex, place, """
        import json, os
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR",
                "DEEPPOD_JOB_ID")
        print(json.dumps({**{k: os.environ[k] for k in keys}, "sum": t.item(), "uid": os.getuid()}))
        dist.destroy_process_group()
    """, workers=2, gpus=2)
    st = ended(ex, h)
    assert st.exit_codes == {0: 0, 1: 0} and not st.stopped, (st, (place / "job/slurm-batch.log").read_text())
    seen = [json.loads((place / f"job/logs/rank-{r}.log").read_text().splitlines()[-1]) for r in (0, 1)]
    assert [s["RANK"] for s in seen] == ["0", "1"] and {s["WORLD_SIZE"] for s in seen} == {"2"}
    assert [s["LOCAL_RANK"] for s in seen] == ["0", "1"] and {s["LOCAL_WORLD_SIZE"] for s in seen} == {"2"}
    assert sorted(s["CUDA_VISIBLE_DEVICES"] for s in seen) == ["0,1", "2,3"]  # Slurm's GRES, one pair each
    assert {s["sum"] for s in seen} == {3.0} and {s["MASTER_ADDR"] for s in seen} == {"127.0.0.1"}
    assert {s["uid"] for s in seen} == {NOBODY} and {s["DEEPPOD_JOB_ID"] for s in seen} == {"1"}
    assert (place / "job/logs/rank-0.marks").read_text().strip()  # deeppod logs interleaves by these


def test_a_worker_over_its_memory_is_killed_by_slurms_cgroup_and_the_reason_says_so(slurm, place):
    ex = executor(slurm)
    h = launch(ex, place, "x = bytearray(900 << 20)\nprint('allocated', flush=True)\n", memory=300)
    st = ended(ex, h)
    assert st.exit_codes[0] != 0 and "ran out of memory" in st.reason, st


def test_a_job_reads_its_datasets_where_they_are_and_nothing_beside_them(slurm, place):
    """No sandbox binds them in on Slurm: its identity is given them (an ACL entry), nobody else."""
    data = place / "datasets" / "hot" / "digits-v1"
    (data / "3").mkdir(parents=True)
    (data / "3" / "a.png").write_bytes(b"png")
    (place / "datasets" / "hot" / "other-tenants").mkdir()
    (place / "datasets" / "hot" / "other-tenants" / "x").write_text("theirs")
    for d in (place / "datasets", place / "datasets" / "hot", data, data / "3",
              place / "datasets" / "hot" / "other-tenants"):
        d.chmod(0o700)
    ex = executor(slurm)
    h = launch(ex, place, f"""
        import os
        print(os.listdir({str(data)!r}), open({str(data / "3" / "a.png")!r}, "rb").read())
        try:
            open({str(place / "datasets" / "hot" / "other-tenants" / "x")!r}).read()
        except PermissionError:
            print("not theirs")
    """, binds=[str(data)])
    st = ended(ex, h)
    assert st.exit_codes == {0: 0}, (st, (place / "job/logs/rank-0.log").read_text())
    assert (place / "job/logs/rank-0.log").read_text().split("\n")[-3:-1] == ["['3'] b'png'", "not theirs"]


def built_env(place, key="k1"):
    """An environment as the builder leaves it (a venv of the tasks' Python) in a folder of the
    server's: its order, the folder, and the lock a build holds."""
    root = place / "envs" / "1"
    (root / key / "bin").mkdir(parents=True)
    (root / key / "bin" / "python").symlink_to(PYTHON)
    (place / "envs").chmod(0o700)
    root.chmod(0o700)
    order = {"key": key, "root": str(root), "requirements": [], "python": None, "base_python": PYTHON, "uv": None,
             "index": {}}
    return order, root / key, root / f"{key}.lock"


def test_a_job_waits_for_its_environment_then_runs_in_it_as_its_identity(slurm, place):
    import fcntl

    order, env, lock = built_env(place)
    ex = executor(slurm)
    with open(lock, "a") as held:  # another job's build of it
        fcntl.flock(held, fcntl.LOCK_EX)
        h = launch(ex, place, "import os, sys; print(sys.executable, os.environ['VIRTUAL_ENV'], os.getuid())",
                   env=order, job_id=11, run="r11")
        assert h["slurm_id"] is None  # not handed to Slurm before its environment is there
        st = wait_until(lambda: (s := ex.poll(h)).phase and s, 30, what="the preparation's phase")
        assert not st.finished and st.phase == "preparing environment"
        assert not slurm.run(["squeue", "-h", "--states=all", "--name=deeppod-local-11", "-o", "%i"]).strip()
        (env.parent / f"{env.name}.json").write_text("{}")  # the other build is done
    st = ended(ex, h)
    assert st.exit_codes == {0: 0}, (st, (place / "job/logs/rank-0.log").read_text())
    assert (place / "job/logs/rank-0.log").read_text().split()[-3:] == [f"{env}/bin/python", str(env), str(NOBODY)]
    assert ex.find(11, place / "job", "r11")["slurm_id"].isdigit()


def test_a_stop_while_its_environment_is_prepared_submits_nothing(slurm, place):
    import fcntl

    order, env, lock = built_env(place, key="k2")
    ex = executor(slurm)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        h = launch(ex, place, "print('ran')", env=order, job_id=12, run="r12")
        wait_until(lambda: ex.poll(h).phase, 30, what="the preparation to start")
        ex.terminate(h)
        (env.parent / f"{env.name}.json").write_text("{}")
    st = ended(ex, h)
    assert st.stopped and st.exit_codes == {} and not st.reason, st
    assert not slurm.run(["squeue", "-h", "--states=all", "--name=deeppod-local-12", "-o", "%i"]).strip()  # none
    assert "ran" not in (place / "job/logs/rank-0.log").read_text()


# trains until SIGTERM, then saves its checkpoint and asks to be resumed (exit 75)
CHECKPOINTS_AT_SIGTERM = """
import signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("training", flush=True)
while not stop:
    time.sleep(0.05)
open("checkpoint", "w").write("step 7")
sys.exit(75)
"""


def test_a_stop_reaches_the_worker_which_checkpoints_and_asks_to_be_resumed(slurm, place):
    ex = executor(slurm)
    h = launch(ex, place, CHECKPOINTS_AT_SIGTERM)
    wait_until(lambda: "training" in (place / "job/logs/rank-0.log").read_text(), 60, what="the worker to start")
    ex.terminate(h)
    st = ended(ex, h)
    assert st.exit_codes == {0: 75} and st.stopped, st
    assert (place / "work/checkpoint").read_text() == "step 7"


def test_a_job_at_its_time_limit_is_told_in_time_to_checkpoint_and_says_so(slurm, place):
    # a minute, Slurm's least: its word comes up to a minute early, and its end at most half a minute late
    ex = executor(slurm)
    h = launch(ex, place, CHECKPOINTS_AT_SIGTERM, grace=1, time_limit=50)
    slurm_id = h["slurm_id"]
    assert " TimeLimit=00:01:00 " in slurm.run(["scontrol", "show", "job", slurm_id, "-o"])  # rounded up
    st = ended(ex, h, timeout=180)
    assert st.exit_codes == {0: 75} and st.timed_out and not st.stopped and not st.reason, st
    assert (place / "work/checkpoint").read_text() == "step 7"


def test_a_job_slurm_holds_back_waits_with_slurms_reason_and_a_stop_takes_it_out_of_the_queue(slurm, place):
    ex = executor(slurm)
    (place / "a").mkdir()
    (place / "b").mkdir()
    (place / "a").chmod(0o711)
    (place / "b").chmod(0o711)
    cpus = os.cpu_count()
    busy = launch(ex, place / "a", "import time; print('busy', flush=True); time.sleep(600)", workers=cpus,
                  job_id=1, grace=1)
    wait_until(lambda: "busy" in (place / "a/job/logs/rank-0.log").read_text(), 60, what="the first job to run")
    held = launch(ex, place / "b", "print('ran')", job_id=2)
    st = wait_until(lambda: (s := ex.poll(held)).phase.endswith("(Resources)") and s, 30, what="Slurm's reason")
    assert not st.finished and st.phase == waiting_reason("Resources"), st
    assert ex.find(2, place / "b/job", "r1") == held and ex.find(2, place / "b/job", "r0") is None
    ex.terminate(held)
    st = ended(ex, held)
    assert st.stopped and st.exit_codes == {}, st
    ex.terminate(busy)
    assert ended(ex, busy).stopped


def test_a_job_slurm_cannot_ever_place_is_refused_at_submit_with_slurms_words(slurm, place):
    with pytest.raises(ExecutorError, match="sbatch"):
        launch(executor(slurm), place, "print(1)", gpus=64)


def test_slurms_nodes_are_deeppods_with_their_cpus_memory_and_gres_gpus(slurm):
    (node,) = executor(slurm).nodes()
    assert node.cpus == os.cpu_count() and node.memory_mb > 1000 and len(node.gpus) == 4 and node.healthy
    assert node.reason == ""  # why it is not healthy: nothing to say


def test_what_slurm_prints_is_read_as_it_means():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert gpus_of("gpu:a100:8(S:0-1),shard:4") == 8 and gpus_of("(null)") == 0
    assert node_reason("down*", "deeppod test: node lost") == "down* in Slurm: deeppod test: node lost"
    assert node_reason("DRAINED", "none") == "drained in Slurm" == node_reason("drained", "")
    assert fields("JobId=7 JobState=PENDING Reason=Resources Dependency=(null)")["Reason"] == "Resources"
    env = task_env({"RANK": "3", "CUDA_VISIBLE_DEVICES": "5"}, {
        "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "DEEPPOD_SLURM_MASTER_ADDR": "10.0.0.1", "DEEPPOD_SLURM_MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "2",
        "SECRET": "the server's"}, 0)
    assert env["LOCAL_RANK"] == "1" and env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["MASTER_ADDR"] == "10.0.0.1" and "SECRET" not in env
    assert "DEEPPOD_NODE_ADDRESS" not in env
    assert task_env({}, {"DEEPPOD_SLURM_MASTER_ADDR": "a", "DEEPPOD_SLURM_MASTER_PORT": "1"}, 0,
                    "gpu-07.cluster")["DEEPPOD_NODE_ADDRESS"] == "gpu-07.cluster"  # where a replica listens
    assert hostnames("n[1-3,07],gpu-a,x[09-10]") == ["n1", "n2", "n3", "n07", "gpu-a", "x09", "x10"]
    assert hostnames("(null)") == [] and hostnames("") == []


def test_where_a_task_says_it_runs_is_kept_only_where_slurm_says_the_job_runs(tmp_path):
    folder = JobFolder(tmp_path)
    folder.exits.mkdir()
    folder.node_file(0).write_text('{"node": "n1", "gpus": "2,3"}')
    folder.node_file(1).write_text('{"node": "the-servers-host", "gpus": "0"}')  # not one of its nodes
    folder.node_file(2).write_text("")  # not started yet
    folder.node_file(3).symlink_to(tmp_path / "elsewhere")  # a link: not followed
    (tmp_path / "elsewhere").write_text('{"node": "n1", "gpus": "0"}')
    folder.node_file(4).write_text('{"node": "n2", "gpus": "-1"}')
    folder.node_file(5).write_text('{"node": "n2", "gpus": ""}')
    assert placed(folder, {"n1", "n2"}) == ((0, "n1", (2, 3)), (5, "n2", ()))


def test_a_job_the_platform_made_runs_the_sites_python_and_finds_deeppod_where_the_site_put_it(tmp_path):
    def spec(command, env):
        return LaunchSpec(job_id=1, job_dir=tmp_path, command=command, workdir="/", workers=[WorkerSpec(0, "?", env)])

    made = site_python(spec([sys.executable, "-m", "deeppod.serve.replica"], {"RANK": "0"}), "/site/py", "/site/lib")
    assert made.command == ["/site/py", "-m", "deeppod.serve.replica"]
    assert made.workers[0].env == {"RANK": "0", "PYTHONPATH": "/site/lib"}
    own = site_python(spec([sys.executable, "x.py"], {"PYTHONPATH": "/mine"}), "/site/py", "/site/lib")
    assert own.workers[0].env["PYTHONPATH"] == "/mine"  # the job's own comes first
    users = spec(["python", "train.py"], {})
    assert site_python(users, "/site/py", "/site/lib") is users  # a user's command is theirs


def test_the_batch_step_looks_up_every_nodes_address_once_for_its_tasks():
    shown = ("NodeName=gpu-01 Arch=x86_64 CoresPerSocket=8 NodeAddr=10.0.0.11 NodeHostName=gpu-01 State=IDLE\n"
             "NodeName=gpu-02 Arch=x86_64 NodeAddr=gpu-02.ib NodeHostName=gpu-02 State=MIXED\n")
    known = parse_node_addrs(shown)
    assert known == {"gpu-01": "10.0.0.11", "gpu-02": "gpu-02.ib"}
    assert node_addr("gpu-02", known) == "gpu-02.ib"  # a task asks no scontrol where the batch step did
    assert parse_node_addrs("") == {}

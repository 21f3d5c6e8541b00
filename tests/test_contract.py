"""The job contract shared by the server, the CLI, the SDK and code inside jobs."""

import os
import sys

from deeppod.contract import (
    ACTIVE_STATES,
    EXIT_RESUME,
    FINAL_STATES,
    HOLDING_STATES,
    JobState,
    base_environment,
    dataset_env_key,
    describe_exit,
    job_path,
    reserved,
    worker_env,
)


def test_every_state_is_either_active_or_final():
    assert ACTIVE_STATES | FINAL_STATES == set(JobState) and not ACTIVE_STATES & FINAL_STATES
    assert HOLDING_STATES < ACTIVE_STATES and JobState.QUEUED not in HOLDING_STATES


def test_a_resize_is_its_own_state_and_holds_its_resources():
    assert JobState.RESIZING != JobState.PREEMPTED
    assert JobState.RESIZING.holds_resources and JobState.PREEMPTED.holds_resources
    assert not JobState.QUEUED.holds_resources


def test_is_final_and_plain_string_values():
    assert [s for s in JobState if s.is_final] == [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                                                   JobState.STOPPED, JobState.PRUNED]
    # what the API returns and clients compare against
    assert JobState.STOPPED == "stopped" and f"{JobState.STOPPED}" == "stopped" and str(JobState.QUEUED) == "queued"
    assert "stopped" in FINAL_STATES  # a client's plain string finds its set



def env(**kw):
    args = dict(job_id=7, rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0,
                master_addr="127.0.0.1", master_port=29500, gpus=(2, 3), cpus=2.0, checkpoint_dir="/c",
                api_url="http://x", token="dp_t")
    args.update(kw)
    return worker_env({"PATH": "/bin", "OMP_NUM_THREADS": "64"}, {"FOO": "bar"}, **args)


def test_torchrun_and_platform_variables():
    e = env()
    assert e["RANK"] == "1" and e["LOCAL_RANK"] == "1" and e["WORLD_SIZE"] == "2" and e["LOCAL_WORLD_SIZE"] == "2"
    assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == "29500"
    assert e["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert e["DEEPPOD_JOB_ID"] == "7" and e["DEEPPOD_CHECKPOINT_DIR"] == "/c"
    assert e["DEEPPOD_API_URL"] == "http://x" and e["DEEPPOD_TOKEN"] == "dp_t"
    assert e["FOO"] == "bar" and e["PATH"] == "/bin"
    assert e["OMP_NUM_THREADS"] == "2"  # the CPU request, not the host's setting
    assert e["PYTHONFAULTHANDLER"] == "1"  # a crash leaves its Python stack in the log (tests/executor/test_local.py)


def test_a_trial_gets_its_parameters_and_sooner_metric_sends():
    e = env(params={"lr": 0.1, "batch_size": 32})
    assert e["DEEPPOD_PARAM_LR"] == "0.1" and e["DEEPPOD_PARAM_BATCH_SIZE"] == "32"
    assert e["DEEPPOD_METRICS_FLUSH_SECONDS"] == "0.2"
    assert "DEEPPOD_METRICS_FLUSH_SECONDS" not in env()  # a plain job sends every second


def test_no_gpus_means_none_visible():
    assert env(gpus=())["CUDA_VISIBLE_DEVICES"] == ""


def test_user_thread_setting_wins():
    e = worker_env({}, {"OMP_NUM_THREADS": "3"}, job_id=1, rank=0, world_size=1, local_rank=0, local_world_size=1,
                   node_rank=0, master_addr="h", master_port=1, gpus=(), cpus=8, checkpoint_dir="/c",
                   api_url="u", token="t")
    assert e["OMP_NUM_THREADS"] == "3" and e["MKL_NUM_THREADS"] == "8"


def test_server_settings_do_not_leak_into_jobs():
    base = base_environment({"PATH": "/bin", "DEEPPOD_DATABASE_URL": "postgresql://secret", "HOME": "/root",
                             "AWS_SECRET_ACCESS_KEY": "s3cr3t", "LC_ALL": "C.UTF-8", "NCCL_DEBUG": "INFO",
                             "PYTEST_CURRENT_TEST": "x"})
    own = os.path.dirname(sys.executable)
    assert base == {"PATH": f"{own}:/bin", "HOME": "/root", "LC_ALL": "C.UTF-8", "NCCL_DEBUG": "INFO"}  # an allow-list


def test_a_jobs_path_carries_none_of_the_server_users_own_folders():
    """Issue 70: jobs inherited (and a refusal echoed) the server's PATH with the folders under its
    user's home; the job's python stays the server's, first."""
    own = os.path.dirname(sys.executable)
    server = f"/home/srv/.pyenv/shims:/home/srv/.cargo/bin:relative:/usr/local/cuda/bin:{own}:/usr/bin:/bin:/home/srv"
    assert base_environment({"PATH": server, "HOME": "/home/srv"})["PATH"] == f"{own}:/usr/local/cuda/bin:/usr/bin:/bin"
    assert job_path("/usr/bin:/root/bin", "/") == f"{own}:/usr/bin:/root/bin"  # a home of / hides nothing
    assert reserved("RANK") and reserved("DEEPPOD_TOKEN") and not reserved("MY_VAR")


def test_dataset_variables_and_exit_descriptions():
    assert dataset_env_key("digits-v2@3") == "DEEPPOD_DATA_DIGITS_V2" and dataset_env_key("a/b.c") == "DEEPPOD_DATA_B_C"
    assert describe_exit(-9) == "was killed by SIGKILL" and describe_exit(3) == "exited with code 3"
    assert describe_exit(-200) == "was killed by signal 200" and EXIT_RESUME == 75
    assert describe_exit(-6).startswith("was killed by SIGABRT; a crash") and "log shows where" in describe_exit(-11)


def test_a_trial_waits_longer_for_its_rungs_decision_than_the_leader_holds_it_and_less_than_a_send():
    from deeppod.contract import JUDGE_WAIT_S, JUDGEMENT_WAIT_S
    from deeppod.runtime.metrics import SEND_TIMEOUT_S

    assert 0 < JUDGE_WAIT_S < JUDGEMENT_WAIT_S < SEND_TIMEOUT_S

from deeppod.jobs.contract import base_environment, reserved, worker_env


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


def test_no_gpus_means_none_visible():
    assert env(gpus=())["CUDA_VISIBLE_DEVICES"] == ""


def test_user_thread_setting_wins():
    e = worker_env({}, {"OMP_NUM_THREADS": "3"}, job_id=1, rank=0, world_size=1, local_rank=0, local_world_size=1,
                   node_rank=0, master_addr="h", master_port=1, gpus=(), cpus=8, checkpoint_dir="/c",
                   api_url="u", token="t")
    assert e["OMP_NUM_THREADS"] == "3" and e["MKL_NUM_THREADS"] == "8"


def test_server_settings_do_not_leak_into_jobs():
    base = base_environment({"PATH": "/bin", "DEEPPOD_DATABASE_URL": "postgresql://secret", "HOME": "/root"})
    assert base == {"PATH": "/bin", "HOME": "/root"}
    assert reserved("RANK") and reserved("DEEPPOD_TOKEN") and not reserved("MY_VAR")


def test_default_job_names():
    from deeppod.jobs.service import default_name

    assert default_name(["python", "train.py", "--epochs", "3"]) == "train.py"
    assert default_name(["python", "-c", "print(1)"]) == "python"
    assert default_name(["/usr/bin/env", "bash", "scripts/run.sh"]) == "run.sh"

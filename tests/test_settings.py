import json
from pathlib import Path

import pytest

from deeppod.errors import InvalidRequest
from deeppod.settings import DEFAULT_PORT, ClientSettings, Settings, local_server_record


def test_server_settings_from_env(tmp_path):
    s = Settings.from_env({"DEEPPOD_HOME": str(tmp_path), "DEEPPOD_PORT": "9999", "DEEPPOD_GPUS": "4"})
    assert s.home == tmp_path and s.port == 9999 and s.gpus == 4
    assert s.db_url == f"sqlite:///{tmp_path / 'deeppod.db'}" and s.jobs_dir == tmp_path / "jobs"
    assert Settings.from_env({}).port == DEFAULT_PORT != 8265


def test_every_field_is_read_from_its_variable_and_defaults_match(tmp_path):
    from dataclasses import fields

    from deeppod.settings import env_name

    assert Settings.from_env({}) == Settings()  # one default per setting, written once
    values = {"bool": "0", "int": "3", "int | None": "3", "float": "2.5", "str": "x", "str | None": "x",
              "Path": str(tmp_path), "Path | None": str(tmp_path)}
    env = {env_name(f.name): values[f.type] if f.type != "bool" else ("0" if f.default else "1")
           for f in fields(Settings)}
    s = Settings.from_env(env)
    for f in fields(Settings):
        assert getattr(s, f.name) != getattr(Settings(), f.name), f"{env_name(f.name)} was not read"
    assert s.grace_seconds == 2.5 and s.housekeeping_interval == 2.5 and s.hot_dir == tmp_path


def test_the_s3_endpoint_is_resolved_with_the_client_settings(tmp_path):
    env = {"DEEPPOD_CONFIG": str(tmp_path / "none.json"), "DEEPPOD_HOME": str(tmp_path)}
    assert ClientSettings.resolve(env=env).s3_endpoint is None
    assert ClientSettings.resolve(env={**env, "AWS_ENDPOINT_URL": "http://aws"}).s3_endpoint == "http://aws"
    assert ClientSettings.resolve(env={**env, "AWS_ENDPOINT_URL": "http://aws",
                                       "DEEPPOD_S3_ENDPOINT": "http://minio"}).s3_endpoint == "http://minio"


def test_bad_setting_says_what_to_fix():
    with pytest.raises(InvalidRequest, match="DEEPPOD_PORT='abc' is not an integer"):
        Settings.from_env({"DEEPPOD_PORT": "abc"})


def test_client_resolution_order(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"url": "http://saved:1", "token": "dp_saved"}))
    home = tmp_path / "home"
    home.mkdir()
    (home / "admin.token").write_text("dp_local\n")
    env = {"DEEPPOD_CONFIG": str(cfg), "DEEPPOD_HOME": str(home)}
    assert ClientSettings.resolve("http://flag:2", "dp_flag", env) == ClientSettings("http://flag:2", "dp_flag")
    assert ClientSettings.resolve(env={**env, "DEEPPOD_TOKEN": "dp_env"}).token == "dp_env"
    assert ClientSettings.resolve(env=env) == ClientSettings("http://saved:1", "dp_saved")
    cfg.unlink()
    assert ClientSettings.resolve(env=env) == ClientSettings(f"http://127.0.0.1:{DEFAULT_PORT}", "dp_local")
    # a remote server never gets the local admin token
    assert ClientSettings.resolve("http://remote:1", env=env).token is None


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.slow  # it starts processes
def test_a_local_server_is_found_whatever_its_port(tmp_path):
    import os

    home = tmp_path / "home"
    home.mkdir()
    (home / "admin.token").write_text("dp_local\n")
    env = {"DEEPPOD_CONFIG": str(tmp_path / "cfg" / "c.json"), "DEEPPOD_HOME": str(home)}
    (home / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:9123", "pid": os.getpid()}))
    assert ClientSettings.resolve(env=env) == ClientSettings("http://127.0.0.1:9123", "dp_local")
    # a file left by a server that died is ignored
    (home / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:9123", "pid": _dead_pid()}))
    assert ClientSettings.resolve(env=env).url == f"http://127.0.0.1:{DEFAULT_PORT}"
    # but the port the last server of this home used is named, not the default, once it stopped
    record = local_server_record(home, env)
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"url": "http://127.0.0.1:9123", "pid": None, "home": str(home)}))
    assert ClientSettings.resolve(env=env).url == "http://127.0.0.1:9123"
    assert ClientSettings.resolve(env={**env, "DEEPPOD_PORT": "9999"}).url == "http://127.0.0.1:9999"
    assert ClientSettings.resolve(env={**env, "DEEPPOD_HOME": str(tmp_path)}).url == f"http://127.0.0.1:{DEFAULT_PORT}"


def _serving(tmp_path, env: dict, name: str, port: int) -> Path:
    """A server of this user with its home in tmp_path/name, running (this process's pid) on ``port``."""
    import os

    home = tmp_path / name
    home.mkdir()
    (home / "admin.token").write_text(f"dp_{name}\n")
    record = local_server_record(home, env)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"url": f"http://127.0.0.1:{port}", "pid": os.getpid(), "home": str(home)}))
    return home


def test_the_one_server_this_user_runs_is_found_and_several_are_an_error_that_lists_them(tmp_path):
    env = {"DEEPPOD_CONFIG": str(tmp_path / "cfg" / "c.json"), "HOME": str(tmp_path / "nohome")}
    _serving(tmp_path, env, "elsewhere", 9200)
    assert ClientSettings.resolve(env=env) == ClientSettings("http://127.0.0.1:9200", "dp_elsewhere")
    # an explicit DEEPPOD_HOME with no server in it is not overridden by another home's server
    assert ClientSettings.resolve(env={**env, "DEEPPOD_HOME": str(tmp_path / "empty")}).url == \
        f"http://127.0.0.1:{DEFAULT_PORT}"
    # a second one: no silent pick, an error that names both and how to choose
    _serving(tmp_path, env, "second", 9300)
    with pytest.raises(InvalidRequest) as err:
        ClientSettings.resolve(env=env)
    assert all(s in err.value.message for s in ("2 DeepPod servers", "http://127.0.0.1:9200", "http://127.0.0.1:9300",
                                                "deeppod login URL"))
    # named: its own admin token comes with it, not the other's
    assert ClientSettings.resolve("http://127.0.0.1:9300", env=env).token == "dp_second"
    # the configured default (deeppod login) settles it
    (tmp_path / "cfg" / "c.json").write_text(json.dumps({"url": "http://127.0.0.1:9200", "token": "dp_saved"}))
    assert ClientSettings.resolve(env=env) == ClientSettings("http://127.0.0.1:9200", "dp_saved")


def test_a_saved_token_is_not_sent_to_another_server(tmp_path):
    env = {"DEEPPOD_CONFIG": str(tmp_path / "c.json"), "HOME": str(tmp_path / "nohome"),
           "DEEPPOD_HOME": str(tmp_path / "empty")}
    saved = {"url": "https://a.example:7447", "token": "dp_a", "ca_cert": "/a.pem"}
    (tmp_path / "c.json").write_text(json.dumps(saved))
    assert ClientSettings.resolve(env=env) == ClientSettings("https://a.example:7447", "dp_a", ca_cert="/a.pem")
    assert ClientSettings.resolve("https://b.example:7447", env=env) == ClientSettings("https://b.example:7447", None)


def test_the_server_logs_no_line_per_http_call_unless_debugging():
    import logging

    from deeppod.server import configure_logging

    configure_logging("INFO")
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    configure_logging("DEBUG")
    assert logging.getLogger("httpx").isEnabledFor(logging.DEBUG)
    configure_logging("INFO")


def test_service_class_thresholds_are_gpu_hours():
    assert Settings().las_thresholds == (2 * 3600.0, 32 * 3600.0)
    assert Settings.from_env({"DEEPPOD_LAS_GPU_HOURS": "0.5, 8"}).las_thresholds == (1800.0, 8 * 3600.0)
    assert Settings.from_env({"DEEPPOD_LAS_GPU_HOURS": "off"}).las_thresholds == ()  # arrival order
    for bad in ("a,b", "8,2", "0,1"):
        with pytest.raises(InvalidRequest, match="DEEPPOD_LAS_GPU_HOURS"):
            Settings.from_env({"DEEPPOD_LAS_GPU_HOURS": bad}).las_thresholds


def test_defragment_reads_yes_and_no_and_says_what_to_set():
    assert Settings.from_env({}).defragment is True
    assert Settings.from_env({"DEEPPOD_DEFRAGMENT": "0"}).defragment is False
    assert Settings.from_env({"DEEPPOD_DEFRAGMENT": "Off"}).defragment is False
    assert Settings.from_env({"DEEPPOD_DEFRAGMENT": "yes"}).defragment is True
    with pytest.raises(InvalidRequest, match="DEEPPOD_DEFRAGMENT.*1 or 0"):
        Settings.from_env({"DEEPPOD_DEFRAGMENT": "maybe"})

"""Building an environment on a node (envs/build.py) as a server that is not root does it: in
place, with uv, from a local folder of wheels; once per key however many ask at once; a
failed or interrupted build never used."""

import io
import subprocess
import sys
import threading

import pytest

from deeppod.envs import build
from tests.helpers import wheel

UV = str(__import__("pathlib").Path(sys.executable).with_name("uv"))


@pytest.fixture
def order(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels, "deeppod-probe", "1.2.3", "pinned")
    (tmp_path / "platform").mkdir()  # a folder of the platform's import path (site skips missing ones)
    return {"key": "k1", "root": str(tmp_path / "envs" / "1"), "requirements": ["deeppod-probe==1.2.3"],
            "python": None, "base_python": sys.executable, "uv": UV,
            "index": {"find_links": str(wheels), "no_index": True}, "layer": [str(tmp_path / "platform")]}


def _python(path, code):
    return subprocess.run([str(path / "bin" / "python"), "-c", code], capture_output=True, text=True).stdout.strip()


@pytest.mark.slow  # it starts processes
def test_an_environment_is_built_once_and_found_after(order, tmp_path):
    logs = [io.BytesIO() for _ in range(3)]
    paths = []
    threads = [threading.Thread(target=lambda log=log: paths.append(build.ensure(order, log, None))) for log in logs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    said = [log.getvalue().decode() for log in logs]
    assert sum("building environment k1" in s for s in said) == 1, said
    assert len(set(paths)) == 1 and build.ready_file(paths[0]).is_file()
    assert _python(paths[0], "import deeppod_probe; print(deeppod_probe.VALUE)") == "pinned"
    assert str(tmp_path / "platform") in _python(paths[0], "import sys; print(sys.path)")  # the platform, layered after
    assert (paths[0] / build.REQUIREMENTS).read_text() == "deeppod-probe==1.2.3\n"
    again = io.BytesIO()
    build.ensure(order, again, None)
    assert "ready (built before)" in again.getvalue().decode()


@pytest.mark.slow  # it starts processes
def test_a_failed_build_says_why_and_leaves_nothing(order):
    order = {**order, "requirements": ["deeppod-probe==9.9.9"]}
    log = io.BytesIO()
    with pytest.raises(build.BuildError, match="9.9.9") as failed:
        build.ensure(order, log, None)
    assert "check the requirements" in str(failed.value)
    assert not build.env_path(order).exists()
    assert not [p for p in build.env_path(order).parent.iterdir() if p.name.startswith((".staging", ".build"))]


@pytest.mark.slow  # it starts processes
def test_a_half_built_environment_is_never_used(order):
    half = build.env_path(order)
    (half / "bin").mkdir(parents=True)  # a server killed mid-build left this, without READY
    (half / "bin" / "python").write_text("broken")
    path = build.ensure(order, io.BytesIO(), None)
    assert build.ready_file(path).is_file()
    assert _python(path, "import deeppod_probe; print(deeppod_probe.VALUE)") == "pinned"


def test_activate_puts_the_environment_first():
    env = build.activate({"root": "/e/1", "key": "k"}, {"PATH": "/usr/bin"})
    assert env["PATH"] == "/e/1/k/bin:/usr/bin" and env["VIRTUAL_ENV"] == "/e/1/k"


@pytest.mark.slow  # it starts processes
def test_without_uv_venv_and_pip_build_it(order):
    path = build.ensure({**order, "uv": None, "key": "k-pip"}, io.BytesIO(), None)
    assert _python(path, "import deeppod_probe; print(deeppod_probe.VALUE)") == "pinned"


@pytest.mark.slow  # it starts processes
def test_a_python_the_node_does_not_have_is_said(order):
    with pytest.raises(build.BuildError, match="3.9"):
        build.ensure({**order, "python": "3.9", "key": "k-39"}, io.BytesIO(), None)

"""What the CLI sends with a job (cli/values.py)."""

import os
import sys

from deeppod.cli.values import exported_env


def test_a_job_finds_the_python_that_runs_deeppod_first(monkeypatch):
    """A version manager's shim first on the shell's PATH is not in a sandbox: `python` must be
    the interpreter DeepPod (and torch) is installed in."""
    own = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", f"/root/.pyenv/shims:{own}:/usr/bin")
    monkeypatch.setenv("VIRTUAL_ENV", "/srv/venv")
    assert exported_env() == {"PATH": f"{own}:/root/.pyenv/shims:/usr/bin", "VIRTUAL_ENV": "/srv/venv"}

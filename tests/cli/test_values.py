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


def test_requirements_come_from_a_requirements_file_a_pyproject_or_a_conda_environment(tmp_path):
    import pytest

    from deeppod.cli.values import read_requirements
    from deeppod.errors import InvalidRequest

    (tmp_path / "requirements.txt").write_text("numpy==2.1.0\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["numpy==2.1.0", "rich>=13"]\n')
    (tmp_path / "environment.yaml").write_text("dependencies:\n  - python=3.11\n  - pip\n  - pip:\n"
                                               "    - numpy==2.1.0\n")
    (tmp_path / "conda.yaml").write_text("dependencies:\n  - cudatoolkit=11.8\n")
    (tmp_path / "bad.txt").write_text("--trusted-host evil\n")
    assert read_requirements(tmp_path / "requirements.txt") == "numpy==2.1.0\n"
    assert read_requirements(tmp_path / "pyproject.toml") == "numpy==2.1.0\nrich>=13"
    assert read_requirements(tmp_path / "environment.yaml") == "numpy==2.1.0"
    with pytest.raises(InvalidRequest, match="conda packages"):
        read_requirements(tmp_path / "conda.yaml")
    with pytest.raises(InvalidRequest, match="not a package requirement"):
        read_requirements(tmp_path / "bad.txt")
    with pytest.raises(InvalidRequest, match="cannot read"):
        read_requirements(tmp_path / "missing.txt")

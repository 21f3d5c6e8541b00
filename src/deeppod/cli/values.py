"""Parsing option values: --env, --workers, --memory, --stop-patience, --older-than, --expires."""

from __future__ import annotations

import os

from deeppod.contract import own_python_first
from deeppod.errors import InvalidRequest
from deeppod.units import time_limit_seconds


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidRequest(f"--env {pair!r} is not KEY=VALUE")
        env[key] = value
    return env


def exported_env() -> dict[str, str]:
    """Like Slurm's default export: the job finds the same programs as your shell (e.g. your
    virtual environment's python), the Python that runs this command first."""
    env = {"PATH": own_python_first(os.environ.get("PATH", os.defpath))}
    if os.environ.get("VIRTUAL_ENV"):
        env["VIRTUAL_ENV"] = os.environ["VIRTUAL_ENV"]
    return env


def parse_workers(value: str) -> tuple[int, int | None]:
    """'2' -> (2, None); '2:8' -> (2, 8)."""
    low, sep, high = value.partition(":")
    try:
        return int(low), (int(high) if sep else None)
    except ValueError:
        raise InvalidRequest(f"--workers {value!r} is not N or MIN:MAX (e.g. 2 or 2:8)") from None


def parse_stop_rules(nan_metric: str | None, patience: str | None) -> list[dict]:
    rules = []
    if nan_metric:
        rules.append({"kind": "nan", "metric": nan_metric})
    if patience:
        parts = patience.split(":")
        try:
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("min", "max")):
                raise ValueError
            rules.append({"kind": "plateau", "metric": parts[0], "patience": int(parts[1]),
                          "mode": parts[2] if len(parts) == 3 else "min"})
        except ValueError:
            raise InvalidRequest(f"--stop-patience {patience!r} is not METRIC:P or METRIC:P:max") from None
    return rules


def parse_memory(value: str | None) -> int | None:
    """'512', '512M', '4G' -> MiB."""
    if value is None:
        return None
    v = value.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}.get(v[-1:], None)
    try:
        return int(float(v[:-1]) * mult) if mult else int(v)
    except ValueError:
        raise InvalidRequest(f"--memory {value!r} is not a size: use e.g. 512M or 4G") from None


def parse_age(value: str, option: str = "--older-than") -> float:
    """'30m', '12h', '7d', '90s' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    try:
        return float(value[:-1]) * units[value[-1]] if value[-1:] in units else float(value)
    except ValueError:
        raise InvalidRequest(f"{option} {value!r} is not a duration: use e.g. 30m, 12h or 7d") from None


def parse_time_limit(value: str | None) -> float | None:
    """--time: '90m', '12h', '2d', or as Slurm writes it (1-12:00:00) -> seconds."""
    return None if value is None else time_limit_seconds(value, "--time")


def read_requirements(path) -> str | None:
    """--requirements FILE's text, checked here first (the server checks it again): a bad line
    is said before anything is sent. FILE may be a requirements.txt, a pyproject.toml (its
    project's dependencies) or a conda environment.yaml (its pip packages)."""
    if path is None:
        return None
    try:
        text = open(path).read()
    except OSError as exc:
        raise InvalidRequest(f"--requirements {path}: cannot read it ({exc.strerror})") from None
    name = os.path.basename(str(path))
    if name.endswith(".toml"):
        text = _from_pyproject(text, path)
    elif name.endswith((".yaml", ".yml")):
        text = _from_environment_yaml(text, path)
    from deeppod.envs.spec import parse

    parse(text, None)
    return text


def _from_pyproject(text: str, path) -> str:
    import tomllib

    try:
        deps = tomllib.loads(text).get("project", {}).get("dependencies", [])
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequest(f"--requirements {path} is not valid TOML ({exc})") from None
    return "\n".join(deps)


def _from_environment_yaml(text: str, path) -> str:
    """A conda environment's pip packages (conda's own packages have no place in a virtual
    environment: name them in its pip list, or leave them to the platform's environment)."""
    import yaml

    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"--requirements {path} is not valid YAML ({exc})") from None
    pip, conda = [], []
    for dep in doc.get("dependencies") or []:
        if isinstance(dep, dict):
            pip += [str(p) for p in dep.get("pip") or []]
        elif not str(dep).startswith(("python", "pip")):
            conda.append(str(dep))
    if conda:
        raise InvalidRequest(f"--requirements {path} names conda packages ({', '.join(conda[:5])}): environments are "
                             "built with pip packages; list them under 'pip:'")
    return "\n".join(pip)

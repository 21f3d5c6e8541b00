"""deeppod.runtime (inside user jobs) and the CLI must not pull in server code."""

import json
import subprocess
import sys

SERVER_PACKAGES = ("deeppod.api", "deeppod.store", "deeppod.jobs", "deeppod.scheduler", "deeppod.executor",
                   "deeppod.server", "deeppod.auth", "deeppod.cluster", "deeppod.data", "deeppod.registry")
HEAVY = ("fastapi", "sqlalchemy", "uvicorn", "alembic", "starlette")


def loaded_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def offenders(mods: set[str], roots) -> list[str]:
    return sorted(m for m in mods if any(m == r or m.startswith(r + ".") for r in roots))


def test_runtime_imports_no_server_code():
    mods = loaded_after("import deeppod.runtime")
    assert offenders(mods, SERVER_PACKAGES + HEAVY) == []
    assert "httpx" not in mods and "typer" not in mods


def test_cli_imports_no_server_code():
    mods = loaded_after("import deeppod.cli.main")
    assert offenders(mods, SERVER_PACKAGES + HEAVY) == []


def test_sdk_imports_no_server_code():
    mods = loaded_after("from deeppod import Client")
    assert offenders(mods, SERVER_PACKAGES + HEAVY) == []


def test_runtime_data_imports_no_server_code():
    mods = loaded_after("import deeppod.runtime.data, deeppod.runtime.trainers.image_classifier")
    assert offenders(mods, SERVER_PACKAGES + HEAVY) == []


def test_supervisor_is_standard_library_only():
    mods = loaded_after("import deeppod.executor.supervisor")
    assert offenders(mods, HEAVY + ("deeppod.api", "deeppod.store", "deeppod.jobs", "httpx", "torch")) == []


def test_inference_evaluation_and_registration_in_jobs_import_no_server_code():
    mods = loaded_after("import deeppod.runtime.inference, deeppod.runtime.evaluate, deeppod.runtime.registry")
    assert offenders(mods, SERVER_PACKAGES + HEAVY) == []


def test_a_serving_replica_imports_no_server_code():
    mods = loaded_after("import deeppod.serve.replica")
    assert offenders(mods, SERVER_PACKAGES + ("sqlalchemy", "alembic", "fastapi")) == []
    assert not any(m in mods for m in ("deeppod.serve.service", "deeppod.serve.controller"))

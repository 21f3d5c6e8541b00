"""deeppod.runtime (inside user jobs) and the CLI must not pull in server code."""

import json
import subprocess
import sys

SERVER_PACKAGES = ("deeppod.api", "deeppod.store", "deeppod.jobs", "deeppod.scheduler", "deeppod.executor",
                   "deeppod.server", "deeppod.auth", "deeppod.cluster", "deeppod.datasets", "deeppod.models",
                   "deeppod.ui")
HEAVY = ("fastapi", "sqlalchemy", "uvicorn", "alembic", "starlette")


def loaded_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def offenders(mods: set[str], roots) -> list[str]:
    return sorted(m for m in mods if any(m == r or m.startswith(r + ".") for r in roots))


def submodules(package: str) -> list[str]:
    import importlib
    import pkgutil

    pkg = importlib.import_module(package)
    return sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, package + "."))


def test_the_check_catches_server_code():
    # the checker itself must be able to fail: a server module does pull in the store
    assert offenders(loaded_after("import deeppod.jobs.service"), SERVER_PACKAGES + HEAVY) != []


def test_every_runtime_module_imports_no_server_code():
    mods = submodules("deeppod.runtime")
    assert {"deeppod.runtime.checkpoint", "deeppod.runtime.metrics", "deeppod.runtime.context",
            "deeppod.runtime.sampler", "deeppod.runtime.stop", "deeppod.runtime.data"} <= set(mods)
    # every module, and every lazily exported name resolved (from deeppod.runtime import *)
    loaded = loaded_after("\n".join(f"import {m}" for m in mods) + "\nfrom deeppod.runtime import *")
    assert set(mods) <= loaded
    assert offenders(loaded, SERVER_PACKAGES + HEAVY + ("deeppod.sdk", "deeppod.cli", "deeppod.serve")) == []
    assert "httpx" not in loaded and "typer" not in loaded


def test_runtime_core_needs_only_the_standard_library_and_torch():
    core = ("checkpoint", "metrics", "context", "sampler", "stop", "scaling", "registry")
    loaded = loaded_after("\n".join(f"import deeppod.runtime.{m}" for m in core))
    assert offenders(loaded, ("PIL", "numpy.distutils", "torchvision", "httpx", "requests", "yaml")) == []


def test_every_cli_module_imports_no_server_code():
    mods = submodules("deeppod.cli")
    loaded = loaded_after("\n".join(f"import {m}" for m in mods if m != "deeppod.cli.__main__"))
    assert offenders(loaded, SERVER_PACKAGES + HEAVY + ("torch", "torchvision")) == []


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
    assert not any(m in mods for m in ("deeppod.deployments.service", "deeppod.deployments.controller"))


def test_the_job_contract_imports_only_the_standard_library():
    before = loaded_after("")
    after = loaded_after("import deeppod.contract")
    new = {m for m in after - before if m.split(".")[0] not in sys.stdlib_module_names}
    assert new == {"deeppod", "deeppod.contract"}
    # and the check can fail: the SDK needs httpx, which is not standard library
    assert "httpx" in {m.split(".")[0] for m in loaded_after("import deeppod.sdk.client")} - sys.stdlib_module_names


def test_the_api_does_not_import_the_console():
    """The server composes the API and the console (server.http_app); the console builds on the
    API's dependencies, never the other way round."""
    assert offenders(loaded_after("import deeppod.api.app"), ("deeppod.ui",)) == []
    assert offenders(loaded_after("import deeppod.ui"), ("deeppod.ui",)) != []  # the check can fail


def test_the_node_side_imports_nothing_above_it():
    """A node reads its GPUs and host (cluster/readings.py) without the monitor that stores the
    readings or the jobs they are attributed to: the Ray executor's samplers run on nodes."""
    loaded = loaded_after("import deeppod.cluster.readings, deeppod.cluster.gpus, deeppod.executor.ray")
    assert offenders(loaded, ("deeppod.monitor", "deeppod.jobs", "deeppod.api")) == []
    assert offenders(loaded_after("import deeppod.monitor.service"), ("deeppod.jobs",)) != []  # it can fail

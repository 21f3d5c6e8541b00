"""deeppod.runtime (inside user jobs) and the CLI must not pull in server code.

Read from the source files (tests/import_graph.py), not by starting interpreters: what a module
imports at import time, ours followed through, others' by their top-level names. Others' are held
to short lists of packages known not to load server code themselves, so the check stays whole."""

import sys

from tests.import_graph import anywhere, loaded, ours, submodules, third_party

SERVER_PACKAGES = ("deeppod.api", "deeppod.store", "deeppod.jobs", "deeppod.scheduler", "deeppod.executor",
                   "deeppod.server", "deeppod.auth", "deeppod.cluster", "deeppod.datasets", "deeppod.models",
                   "deeppod.ui")
HEAVY = ("fastapi", "sqlalchemy", "uvicorn", "alembic", "starlette")
# what a job's process may load at import time besides the standard library (none loads server code)
JOB_SIDE = {"torch", "torchvision", "numpy", "PIL"}


def offenders(mods: set[str], roots) -> list[str]:
    return sorted(m for m in mods if any(m == r or m.startswith(r + ".") for r in roots))


def test_the_check_catches_server_code():
    # the checker itself must be able to fail: a server module does pull in the store and SQLAlchemy
    found = loaded("deeppod.jobs.service")
    assert offenders(found, SERVER_PACKAGES) != [] and "sqlalchemy" in third_party(found)
    # lazily exported names count for what they load: ``from deeppod import Client`` loads the SDK
    assert "deeppod.sdk.client" in loaded("deeppod.__all_exports__")
    assert "httpx" in third_party(loaded("deeppod.sdk.client"))


def test_every_runtime_module_imports_no_server_code():
    mods = submodules("deeppod.runtime")
    assert {"deeppod.runtime.checkpoint", "deeppod.runtime.metrics", "deeppod.runtime.context",
            "deeppod.runtime.sampler", "deeppod.runtime.stop", "deeppod.runtime.data"} <= set(mods)
    # every module, and every lazily exported name resolved (from deeppod.runtime import *)
    found = loaded(*mods, "deeppod.runtime.__all_exports__")
    assert set(mods) <= found
    assert offenders(found, SERVER_PACKAGES + HEAVY + ("deeppod.sdk", "deeppod.cli", "deeppod.serve")) == []
    assert third_party(found) <= JOB_SIDE, third_party(found)


def test_runtime_core_needs_only_the_standard_library_and_torch():
    core = ("checkpoint", "metrics", "context", "sampler", "stop", "scaling", "registry")
    assert third_party(loaded(*(f"deeppod.runtime.{m}" for m in core))) <= {"torch"}


def test_every_cli_module_imports_no_server_code():
    mods = submodules("deeppod.cli")
    found = loaded(*(m for m in mods if m != "deeppod.cli.__main__"))
    assert offenders(found, SERVER_PACKAGES) == []
    assert third_party(found) <= {"typer", "rich", "yaml", "httpx"}, third_party(found)


def test_sdk_imports_no_server_code():
    found = loaded("deeppod.__all_exports__", "deeppod.sdk.client")
    assert offenders(found, SERVER_PACKAGES) == [] and third_party(found) <= {"httpx", "yaml"}


def test_supervisor_is_standard_library_only():
    found = loaded("deeppod.executor.supervisor")
    assert offenders(found, ("deeppod.api", "deeppod.store", "deeppod.jobs")) == [] and third_party(found) == set()


def test_inference_evaluation_and_registration_in_jobs_import_no_server_code():
    found = loaded("deeppod.runtime.inference", "deeppod.runtime.evaluate", "deeppod.runtime.registry")
    assert offenders(found, SERVER_PACKAGES) == [] and third_party(found) <= JOB_SIDE


def test_a_serving_replica_imports_no_server_code():
    found = loaded("deeppod.serve.replica")
    assert offenders(found, SERVER_PACKAGES) == []
    assert third_party(found) <= JOB_SIDE | {"starlette", "uvicorn", "anyio", "httptools", "uvloop"}
    assert not any(m in found for m in ("deeppod.deployments.service", "deeppod.deployments.controller"))


def test_the_job_contract_imports_only_the_standard_library():
    found = loaded("deeppod.contract")
    assert {m for m in found if ours(m)} == {"deeppod", "deeppod.contract"} and third_party(found) == set()
    assert all(m.split(".")[0] in sys.stdlib_module_names or m == "__future__" for m in found if not ours(m))


def test_the_api_does_not_import_the_console():
    """The server composes the API and the console (server.http_app); the console builds on the
    API's dependencies, never the other way round."""
    assert offenders(loaded("deeppod.api.app"), ("deeppod.ui",)) == []
    assert offenders(loaded("deeppod.ui"), ("deeppod.api",)) != []  # the check can fail: that arrow exists


def test_the_node_side_imports_nothing_above_it():
    """A node reads its GPUs and host (cluster/readings.py) without the monitor that stores the
    readings or the jobs they are attributed to: the Ray executor's samplers run on nodes."""
    found = loaded("deeppod.cluster.readings", "deeppod.cluster.gpus", "deeppod.executor.ray")
    assert offenders(found, ("deeppod.monitor", "deeppod.jobs", "deeppod.api")) == []
    assert offenders(loaded("deeppod.monitor.service"), ("deeppod.executor",)) != []  # it can fail


def test_every_module_of_ours_can_be_read_and_its_imports_found():
    """The reader knows every module: an import of ours that names no file fails here."""
    assert len(loaded(*submodules("deeppod"))) > 200


# The layers, lowest first: a module imports from its own layer and those below it, never above
# (at import time or inside a function). The services are ordered among themselves, each above
# those it calls; a controller (the loops that apply decisions) sits above every service.
LAYERS = (
    "contract errors units states settings atomic nofollow posix_acl refs job_folder job_spec loops transport",
    "store scheduler runtime serve",
    "auth",
    "audit cluster datasets envs sizing",
    "executor plans s3",
    "bench jobs",
    "models monitor notebooks",
    "deployments experiments",
    "controllers",
    "api",
    "ui",
    "server memory",
    "sdk cli",
)
CONTROLLERS = {"deeppod.jobs.controller", "deeppod.deployments.controller", "deeppod.experiments.controller",
               "deeppod.monitor.loop"}


def layer_of(module: str) -> int:
    name = "controllers" if module in CONTROLLERS else module.split(".")[1]
    found = [i for i, layer in enumerate(LAYERS) if name in layer.split()]
    assert found, f"{module}: its package {name!r} is in no layer of LAYERS (tests/test_import_graph.py): add it"
    return found[0]


def arrows() -> list[tuple[str, str]]:
    """Every import of one of our modules by another; not of its own packages (``from deeppod.ui
    import forms`` loads deeppod.ui first, as every module of it does), nor the root's lazy table."""
    return sorted((m, t) for m in submodules("deeppod") for t in anywhere(m)
                  if ours(t) and not m.startswith(t + ".") and not t.endswith(".__all_exports__") and t != m)


def test_every_arrow_points_down_the_layers():
    up = [f"{m} (layer {LAYERS[layer_of(m)]!r}) imports {t} (layer {LAYERS[layer_of(t)]!r})"
          for m, t in arrows() if layer_of(t) > layer_of(m)]
    assert up == [], "\n".join(up)


def test_the_layer_check_can_fail():
    assert layer_of("deeppod.ui.render") > layer_of("deeppod.api.deps") > layer_of("deeppod.jobs.controller")
    assert layer_of("deeppod.jobs.controller") > layer_of("deeppod.jobs.service") > layer_of("deeppod.store.models")
    assert ("deeppod.ui.routes.jobs", "deeppod.api.deps") in arrows()  # the reader sees arrows, down ones here
    assert ("deeppod.deployments.forward", "deeppod.serve.inputs") in arrows()  # imports inside functions count


def test_no_two_packages_or_files_import_each_other():
    mods = set(arrows())
    assert [(a, b) for a, b in mods if (b, a) in mods and a < b] == []
    packages = {(a.split(".")[1], b.split(".")[1]) for a, b in mods if a.split(".")[1] != b.split(".")[1]}
    assert [(a, b) for a, b in packages if (b, a) in packages and a < b] == []


def test_the_console_calls_services_not_the_apis_routes():
    """The console shares the API's dependencies and schemas, never a route's function."""
    assert [(m, t) for m, t in arrows() if m.startswith("deeppod.ui.") and t.startswith("deeppod.api.routers")] == []

"""docs/architecture.md's table and src/deeppod/ agree."""

import re

from tests.helpers import ROOT

SRC = ROOT / "src" / "deeppod"


def table() -> dict[str, str]:
    rows = re.findall(r"^\| `([a-z0-9_]+(?:/|\.py))` \| (.+?) \|", (ROOT / "docs" / "architecture.md").read_text(),
                      re.M)
    return dict(rows)


def test_every_package_and_top_level_module_is_in_the_table_and_nothing_else():
    rows = table()
    planned = {m for m, owns in rows.items() if owns.startswith("planned")}
    on_disk = {p.name + "/" for p in SRC.iterdir() if (p / "__init__.py").exists()}
    on_disk |= {p.name for p in SRC.glob("*.py") if p.name != "__init__.py"}
    assert set(rows) - planned == on_disk
    assert not planned & on_disk, "a planned package exists now: describe what it owns"


def test_each_api_resource_has_its_schemas_and_cli_module_of_the_same_name():
    routers = {p.stem for p in (SRC / "api" / "routers").glob("*.py") if p.stem != "__init__"}
    for resource in ("jobs", "datasets", "models", "deployments", "experiments"):
        assert resource in routers
        assert (SRC / "api" / "schemas" / f"{resource}.py").exists()
        assert (SRC / "cli" / f"{resource}.py").exists()
        assert (SRC / resource / "service.py").exists()


def _sources():
    return [(p, p.read_text()) for p in SRC.rglob("*.py") if "migrations" not in p.parts]


def test_only_the_atomic_module_renames_into_place():
    assert [p.relative_to(SRC).as_posix() for p, text in _sources() if "os.replace(" in text] == ["atomic.py"]


def test_the_job_folder_files_are_named_only_by_job_folder():
    names = ('"spec.json"', '"result.json"', '"workers.json"', '"supervisor.json"', '"shared-check"', '"spares.json"',
             '"world.json"', '"evaluation.json"', '"grow-', '"rank-', '"exit"', '".sandbox-')
    offenders = sorted({p.relative_to(SRC).as_posix() for p, text in _sources() for n in names if n in text})
    assert offenders == ["job_folder.py"]


def test_no_function_is_longer_than_80_lines():
    """A function a newcomer can hold in the head (migrations aside: they are generated)."""
    import ast

    long = [f"{p.relative_to(SRC).as_posix()}:{n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p, text in _sources() for n in ast.walk(ast.parse(text))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 80]
    assert long == []


def test_the_job_controller_stays_small():
    assert len((SRC / "jobs" / "controller.py").read_text().splitlines()) <= 250


def test_each_resource_has_one_noun_for_its_route_cli_group_and_console_pages():
    """``/v1/NOUN``, ``deeppod NOUN`` (the short names stay: data, deploy, tune) and the console's
    ``ui/routes/NOUN.py`` for the resources the console shows."""
    import typer

    from deeppod.cli.main import app

    cli = set(typer.main.get_command(app).commands)
    for noun in ("jobs", "datasets", "models", "deployments", "experiments", "nodes"):
        prefixes = {getattr(r, "path", "").split("/")[2] for r in _router(noun).routes if getattr(r, "path", "")
                    .startswith("/v1/")}
        assert prefixes == {noun}, (noun, prefixes)
        assert noun in cli, noun
    for noun in ("jobs", "datasets", "models", "deployments"):
        assert (SRC / "ui" / "routes" / f"{noun}.py").exists(), noun
    assert {"data", "deploy", "tune"} <= cli


def _router(noun: str):
    import importlib

    return importlib.import_module(f"deeppod.api.routers.{noun}").router

"""docs/architecture.md's table and src/deeppod/ agree."""

import re

from tests.helpers import ROOT

SRC = ROOT / "src" / "deeppod"


def table() -> dict[str, str]:
    rows = re.findall(r"^\| `([a-z_]+(?:/|\.py))` \| (.+?) \|", (ROOT / "docs" / "architecture.md").read_text(), re.M)
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
    for resource in ("jobs", "datasets", "models", "deployments"):
        assert resource in routers
        assert (SRC / "api" / "schemas" / f"{resource}.py").exists()
        assert (SRC / "cli" / f"{resource}.py").exists()
        assert (SRC / resource / "service.py").exists()

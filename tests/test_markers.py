"""Every test that starts real servers or processes carries the 'slow' mark."""

import pytest

from tests.helpers import ROOT


class _Collected:
    """A plugin that keeps what a collection found: each test's id and whether it is marked slow."""

    def __init__(self):
        self.items: dict[str, bool] = {}

    def pytest_collection_finish(self, session):
        self.items = {i.nodeid: i.get_closest_marker("slow") is not None for i in session.items}


def collected(*paths: str) -> dict[str, bool]:
    """Collect ``paths`` in this process, as the suite does (its conftest marks the tests): no
    interpreter is started, and the test modules are mostly imported already."""
    found = _Collected()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT),
                        *(str(ROOT / p) for p in paths)], plugins=[found])
    assert code == 0, f"collecting {paths} failed ({code})"
    return found.items


def test_the_quick_run_starts_no_servers_or_processes():
    items = collected("tests/e2e", "tests/cli/test_cli.py", "tests/executor/test_local.py",
                      "tests/datasets/test_tiers.py")
    quick = [t for t, slow in items.items() if not slow and not t.startswith("tests/datasets/")]
    assert quick == []
    slow = [t for t, s in items.items() if s]
    assert any("test_training.py" in t for t in slow) and any("test_cli.py" in t for t in slow)
    assert any("killed_midway" in t for t in slow)  # test_tiers: by its fixture, not its folder
    assert not all(items[t] for t in items if t.startswith("tests/datasets/"))  # the others there stay quick


def _timeouts(node) -> list[int]:
    """Literal ``timeout=N`` arguments in a function's body (subprocess.run, Client.wait, ...)."""
    import ast

    calls = [c for c in ast.walk(node) if isinstance(c, ast.Call)]
    found = [k.value.value for call in calls for k in call.keywords
             if k.arg == "timeout" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, (int, float))]
    found += [c.args[1].value for c in calls  # wait_until(pred, timeout, ...)
              if isinstance(c.func, ast.Name) and c.func.id == "wait_until" and len(c.args) > 1
              and isinstance(c.args[1], ast.Constant) and isinstance(c.args[1].value, (int, float))]
    return [int(v / 1000 if v >= 10_000 else v) for v in found]  # Playwright counts milliseconds


def _mark_timeout(node) -> int | None:
    import ast

    for d in node.decorator_list:
        if (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "timeout"
                and d.args and isinstance(d.args[0], ast.Constant)):
            return int(d.args[0].value)
    return None


def test_no_test_waits_longer_than_pytest_lets_it_run():
    """A test whose own wait (a subprocess's timeout, a job's) is longer than its pytest timeout
    is killed by pytest first, with a less useful message: its mark must allow the wait."""
    import ast
    import tomllib

    default = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["timeout"]
    short = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                limit = _mark_timeout(node) or default
                waits = _timeouts(node)
                if waits and max(waits) > limit:
                    short.append(f"{path.relative_to(ROOT)}::{node.name} waits {max(waits)} s, pytest allows {limit} s")
    assert not short, "\n".join(short)

"""The import graph of src/deeppod read from its files, not by importing them: which modules
(ours and others') an ``import`` of one of ours loads at import time. What a module imports
inside a function runs later, when called, and is not counted; what a package's lazy
``__getattr__`` loads (its ``_EXPORTS`` table) is, for the names asked for."""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def _path(module: str) -> Path | None:
    """The file of one of our modules (a package's __init__.py), None if there is none."""
    base = SRC.joinpath(*module.split("."))
    for p in (base / "__init__.py", base.with_suffix(".py")):
        if p.is_file():
            return p
    return None


def _compiled(module: str) -> bool:
    """One of ours built from C (an extension module): it imports nothing of ours."""
    base = SRC.joinpath(*module.split("."))
    return any(base.parent.glob(base.name + ".*.so"))


def ours(module: str) -> bool:
    return module == "deeppod" or module.startswith("deeppod.")


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _at_import(body: list[ast.stmt]):
    """The statements of ``body`` that run when the module is imported (not in functions, nor
    under ``if TYPE_CHECKING``), nested blocks included."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and _type_checking(node.test):
            yield from _at_import(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _at_import([n.body if isinstance(n, ast.ExceptHandler) else n for n in inner]
                                      if field != "handlers" else [s for h in inner for s in h.body])
        if isinstance(node, ast.Match):
            for case in node.cases:
                yield from _at_import(case.body)


@cache
def _parsed(module: str) -> ast.Module:
    return ast.parse(_path(module).read_text())


@cache
def exports(module: str) -> dict[str, str]:
    """A package's lazy names (its ``_EXPORTS`` table: name -> module), as its __getattr__ loads them."""
    for node in _parsed(module).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)}
    return {}


def _resolved(module: str, nodes) -> frozenset[str]:
    """The modules the import statements ``nodes`` of ``module`` name (modules, not names)."""
    is_pkg = _path(module).name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            found.add(base)
            found.update(_named(base, a.name) for a in node.names)
    found.discard(None)
    return frozenset(found)


@cache
def direct(module: str) -> frozenset[str]:
    """What importing ``module`` itself imports at import time (modules, not names)."""
    return _resolved(module, _at_import(_parsed(module).body))


@cache
def anywhere(module: str) -> frozenset[str]:
    """Every module ``module`` imports, at import time or later inside a function (an import
    that waits for a call is an arrow all the same); not what only type checkers read."""
    skipped = {id(n) for node in ast.walk(_parsed(module)) if isinstance(node, ast.If) and _type_checking(node.test)
               for stmt in node.body for n in ast.walk(stmt)}
    return _resolved(module, (n for n in ast.walk(_parsed(module)) if id(n) not in skipped))


def _named(base: str, name: str) -> str | None:
    """What ``from base import name`` loads besides ``base``: a submodule, or (ours) what its
    lazy table names; ``*`` asks for every name of the table."""
    if not ours(base):
        return None
    if name == "*":
        return None if not exports(base) else f"{base}.__all_exports__"
    if _path(f"{base}.{name}") is not None:
        return f"{base}.{name}"
    return exports(base).get(name)


def loaded(*modules: str) -> set[str]:
    """Every module an import of ``modules`` (or ``pkg.__all_exports__``: ``from pkg import *``)
    loads: ours transitively, with their parent packages; others' as imported (top-level names)."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if m.endswith(".__all_exports__"):
            todo.extend(exports(m.removesuffix(".__all_exports__")).values())
            continue
        if not ours(m):
            continue
        parts = m.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # its packages' __init__ first
        if _path(m) is not None:
            todo.extend(direct(m))
        elif not _compiled(m):
            raise ModuleNotFoundError(f"{m}: no such module under {SRC}")
    return {m for m in seen if not m.endswith(".__all_exports__")}


def third_party(mods: set[str]) -> set[str]:
    """The top-level names of what is neither ours nor the standard library's."""
    return {m.split(".")[0] for m in mods if not ours(m)} - set(sys.stdlib_module_names) - {"__future__"}


def submodules(package: str) -> list[str]:
    """Every module and package under ``package`` (folders that are not packages, such as
    Alembic's migration scripts, are not imported as modules and are left out)."""
    root = SRC.joinpath(*package.split("."))
    found = []
    for p in root.rglob("*.py"):
        if p.name == "__init__.py" and p.parent == root:
            continue
        if any(not (root / d / "__init__.py").is_file() for d in p.relative_to(root).parents):
            continue
        found.append(package + "." + ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"))
    return sorted(found)

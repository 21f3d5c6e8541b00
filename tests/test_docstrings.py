"""No docstring longer than its function's body (issue 72): the history of a function (what a
benchmark measured, what broke once) belongs in docs/benchmarks.md and the commit message.

Exempt, because there the docstring is the documentation users read: an interface method whose
body is its docstring (a Protocol's, an executor's), an API route's (the OpenAPI document's
text), the SDK's methods, and the public names of a module's ``__all__`` (with their methods)."""

import ast

from tests.helpers import ROOT

SRC = ROOT / "src" / "deeppod"


def _public(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ("__all__", "_EXPORTS")
                                                for t in node.targets):
            value = node.value
            if isinstance(value, ast.Dict):
                names |= {k.value for k in value.keys if isinstance(k, ast.Constant)}
            elif isinstance(value, (ast.List, ast.Tuple)):
                names |= {e.value for e in value.elts if isinstance(e, ast.Constant)}
    return names


def _exported() -> set[str]:
    return set().union(*(_public(ast.parse(p.read_text())) for p in SRC.rglob("__init__.py")))


def too_long(text: str, public: set[str]) -> list[str]:
    """``name: docstring lines > body lines`` for each function of a module's text that breaks it."""
    tree = ast.parse(text)
    public = public | _public(tree)
    found = []

    def visit(node: ast.AST, owner: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, owner or child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                top = owner or child.name
                doc = child.body[0]
                rest = child.body[1:]
                if ast.get_docstring(child) is not None and rest and top not in public:
                    doc_lines = doc.end_lineno - doc.lineno + 1
                    body_lines = rest[-1].end_lineno - rest[0].lineno + 1
                    if doc_lines > 1 and doc_lines > body_lines:
                        found.append(f"{child.name}:{child.lineno}: {doc_lines} > {body_lines}")
                visit(child, top)

    visit(tree, None)
    return found


def test_no_docstring_is_longer_than_its_functions_body():
    public = _exported()
    broken = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("api/routers/", "sdk/", "store/migrations/")):
            continue
        if found := too_long(path.read_text(), public):
            broken[rel] = found
    assert not broken, f"shorten these docstrings (the history goes in docs/benchmarks.md): {broken}"


def test_the_check_finds_an_essay_on_a_one_line_function_and_spares_the_public_and_interfaces():
    text = '''
def essay(x):
    """One.
    Two.
    Three."""
    return x


def short(x):
    """Says why."""
    return x


class Proto:
    def method(self):
        """An interface's docstring
        is its whole body."""


def shown(x):
    """Public: users read
    this."""
    return x
'''
    assert too_long(text, {"shown"}) == ["essay:2: 3 > 1"]

"""Every command the docs name is one the CLI has: a renamed or misspelt command in a guide
(`deeppod jobs show` for `deeppod job show`) fails here, not in a new user's terminal."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from deeppod.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
# a command as the docs write it: in backticks or on a line of a code block, up to its first option
COMMAND = re.compile(r"(?:`|^\s*(?:\$\s*)?)deeppod((?: [a-z][a-z0-9-]*)+)", re.MULTILINE)


def _missing(text: str, where: str, root) -> list[str]:
    out = []
    for m in COMMAND.finditer(text):
        cmd, words, path = root, m.group(1).split(), ["deeppod"]
        for i, word in enumerate(words):
            if not hasattr(cmd, "resolve_command"):  # a command, not a group (typer may bring its own click)
                if not any(type(p).__name__.endswith("Argument") for p in cmd.params):
                    out.append(f"{where}: deeppod {' '.join(words)} ('{' '.join(path)}' takes no argument "
                               f"'{word}')")
                break  # the rest are the command's arguments
            try:  # as the CLI resolves it (a group may have a default command: 'deeppod deploy MODEL')
                name, sub, _ = cmd.resolve_command(cmd.context_class(cmd), words[i:])
            except Exception:  # click's UsageError: no such command
                name, sub = word, None
            if sub is None:
                out.append(f"{where}: deeppod {' '.join(words)} ('{word}' is not a command of '{' '.join(path)}')")
                break
            cmd = sub
            path.append(name)
            if name != word:  # the default command took this word as its argument
                break
    return out


def _docs() -> dict[str, str]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in files}


def test_every_command_the_docs_name_exists():
    root = typer.main.get_command(app)
    assert [m for where, text in _docs().items() for m in _missing(text, where, root)] == []


def test_a_command_that_does_not_exist_is_found():
    root = typer.main.get_command(app)
    found = _missing("meanwhile `deeppod jobs show` says it; `deeppod job show 3` does too\n", "jobs.md", root)
    assert len(found) == 1 and found[0].startswith("jobs.md: deeppod jobs show")

"""Every command's --help is part of the CLI's contract: it changes only on purpose. The committed
text (docs/reference/cli.txt, every command at 120 columns) shows a change as a diff. After a
change meant to show, write it again:
DEEPPOD_TEST_WRITE_REFERENCE=1 ./scripts/test tests/cli/test_help.py"""

import difflib
import os
from pathlib import Path
from unittest import mock

import pytest
import typer
import typer.testing
from typer.testing import CliRunner

from deeppod.cli.main import app

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.txt"
WIDTH = {"COLUMNS": "120", "TERMINAL_WIDTH": "120", "NO_COLOR": "1"}


def _paths(command, path: list[str]):
    yield path
    for name in sorted(getattr(command, "commands", {})):
        yield from _paths(command.commands[name], [*path, name])


def test_no_help_text_is_taken_for_rich_markup():
    """Typer reads help as rich markup: 'NAME[@VERSION]' would show as 'NAME'."""
    from rich.text import Text

    eaten = [(path, text) for path, command in _commands() for text in
             [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
             if Text.from_markup(text).plain != text]
    assert eaten == []


def _commands():
    root = typer.main.get_command(app)
    for path in _paths(root, []):
        command = root
        for name in path:
            command = command.commands[name]
        yield path, command


def every_help() -> str:
    runner = CliRunner()
    out = []
    command = typer.main.get_command(app)
    # the runner builds the whole command tree again at every call (0.5 s of 0.55): built once here
    with mock.patch.object(typer.testing, "_get_command", lambda _app: command):
        for path in _paths(command, []):
            result = runner.invoke(app, [*path, "--help"], env=WIDTH, prog_name="deeppod")
            assert result.exit_code == 0, (path, result.output)
            out.append(f"$ deeppod {' '.join([*path, '--help'])}\n{result.output}")
    return "\n".join(out)


@pytest.mark.slow  # 133 commands rendered: 7 s on two cores
def test_every_commands_help_is_the_committed_one():
    now = every_help()
    assert now.count("$ deeppod ") > 100  # every command and group, not the top only
    if os.environ.get("DEEPPOD_TEST_WRITE_REFERENCE"):
        REFERENCE.write_text(now)
    diff = "".join(difflib.unified_diff(REFERENCE.read_text().splitlines(True), now.splitlines(True),
                                        "docs/reference/cli.txt", "the CLI now", n=2))
    assert diff == "", f"a command's --help changed:\n{diff[:6000]}"

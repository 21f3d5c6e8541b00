"""``deeppod``: the command line. Each resource's commands live in their own module."""

from __future__ import annotations

import copy
import inspect
import os
import sys
from collections.abc import Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Annotated

import typer
import typer.main
from typer.core import TyperGroup

from deeppod.cli import (
    admin,
    audit,
    bench,
    datasets,
    deployments,
    envs,
    experiments,
    images,
    jobs,
    models,
    notebooks,
    plans,
    server,
    size,
    terminal,
    top,
    train,
)
from deeppod.cli import output as output_module
from deeppod.cli.output import console, err_console
from deeppod.errors import DeepPodError

if TYPE_CHECKING:
    from typer._click.core import Command

app = typer.Typer(no_args_is_help=True, add_completion=True,
                  help="DeepPod: shared GPUs, bring-your-own-framework jobs. Shell completion: "
                       "deeppod --install-completion")
for commands in (server.app, jobs.app, train.app, admin.app, plans.app, bench.app, audit.app, top.app, size.app,
                 terminal.app):
    app.add_typer(commands)
app.add_typer(datasets.app, name="data")
app.add_typer(models.app, name="models")
app.add_typer(deployments.app, name="deploy")
app.add_typer(experiments.app, name="tune")
app.add_typer(envs.app, name="envs")
app.add_typer(images.app, name="images")
app.add_typer(notebooks.app, name="notebook")
# The resource's own noun, as the API, the packages and the console name it; the short names stay.
NOUNS = {"datasets": ("data", datasets.app), "deployments": ("deploy", deployments.app),
         "experiments": ("tune", experiments.app)}
for noun, (short, group) in NOUNS.items():
    app.add_typer(group, name=noun, help=f"The same commands as 'deeppod {short}'.")


def _one_line(doc: str) -> str:
    """A command's line in a listing: its docstring's first sentence, its line breaks undone
    (the listing kept them, and cut descriptions mid-sentence at 80 columns)."""
    first = " ".join(doc.split("\n\n")[0].split())
    end = first.find(". ")
    return first if end < 0 else first[:end + 1]


def _short_helps(t: typer.Typer) -> None:
    for info in t.registered_commands:
        doc = info.help or inspect.getdoc(info.callback) or ""
        if info.short_help is None and doc:
            info.short_help = _one_line(doc)
    for group in t.registered_groups:
        _short_helps(group.typer_instance)


_short_helps(app)


def _print_version(value: bool) -> None:
    if value:
        from deeppod import __version__

        console.print(f"deeppod {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="print the version and exit")] = False,
          output: Annotated[str, typer.Option("--output", "-o", help="wide: tables show every column and "
                                              "whole reasons, whatever the terminal's width")] = "") -> None:
    """DeepPod: shared GPUs, bring-your-own-framework jobs. Shell completion: deeppod --install-completion"""
    if output not in ("", "wide"):
        raise typer.BadParameter(f"-o takes 'wide' (got {output!r}); JSON is --json on each command")
    output_module.WIDE = output == "wide"


class LazyCommands(MutableMapping):
    """A group's commands by name, each made into a click command the first time it is asked
    for. Typer reads every function's signature and type hints to make one, and a command line
    runs one command: making all ~110 cost about 0.15 s of CPU on every call."""

    def __init__(self, makers: dict[str, Callable[[], Command]]):
        self._makers = makers
        self._made: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._made:
            self._made[name] = self._makers[name]()
        return self._made[name]

    def __setitem__(self, name: str, cmd: Command) -> None:
        self._made[name] = cmd
        self._makers.setdefault(name, lambda: cmd)

    def __delitem__(self, name: str) -> None:
        del self._makers[name]
        self._made.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def _makers(t: typer.Typer) -> dict[str, Callable[[], Command]]:
    """What typer.main.get_group_from_info makes of a Typer's commands, in its order, unmade:
    its own commands, then its groups (a group added without a name lends its commands)."""
    opts = {"pretty_exceptions_short": t.pretty_exceptions_short, "rich_markup_mode": t.rich_markup_mode}
    out: dict[str, Callable[[], Command]] = {}
    for info in t.registered_commands:
        name = info.name or typer.main.get_command_name(info.callback.__name__)
        out[name] = lambda info=info: typer.main.get_command_from_info(info, **opts)
    for group in t.registered_groups:
        if group.name:
            out[group.name] = lambda group=group: typer.main.get_group_from_info(
                group, suggest_commands=t.suggest_commands, **opts)
        else:
            out.update(_makers(group.typer_instance))
    return out


def command() -> TyperGroup:
    """The ``deeppod`` command, as typer.main.get_command(app) makes it, but each subcommand made
    only when it runs (or when help lists it)."""
    shell = copy.copy(app)  # the callback, its options and completion; no commands
    shell.registered_commands, shell.registered_groups = [], []
    root = typer.main.get_command(shell)
    root.commands = LazyCommands(_makers(app))
    return root


def main() -> None:
    # Typer checks options through pydantic, whose first check otherwise reads every installed
    # package's entry points for plugins (~20 ms of each command); DeepPod has none.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    try:
        command()()
    except DeepPodError as exc:
        err_console.print(f"[red]error:[/] {exc.message}", highlight=False)
        sys.exit(2 if exc.status in (400, 401, 403, 404, 409, 413, 422) else 1)


if __name__ == "__main__":
    main()

"""``deeppod``: the command line. Each resource's commands live in their own module."""

from __future__ import annotations

import inspect
import sys
from typing import Annotated

import typer

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
    plans,
    server,
    size,
    top,
    train,
)
from deeppod.cli import output as output_module
from deeppod.cli.output import console, err_console
from deeppod.errors import DeepPodError

app = typer.Typer(no_args_is_help=True, add_completion=True,
                  help="DeepPod: shared GPUs, bring-your-own-framework jobs. Shell completion: "
                       "deeppod --install-completion")
for commands in (server.app, jobs.app, train.app, admin.app, plans.app, bench.app, audit.app, top.app, size.app):
    app.add_typer(commands)
app.add_typer(datasets.app, name="data")
app.add_typer(models.app, name="models")
app.add_typer(deployments.app, name="deploy")
app.add_typer(experiments.app, name="tune")
app.add_typer(envs.app, name="envs")
app.add_typer(images.app, name="images")
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


def main() -> None:
    try:
        app()
    except DeepPodError as exc:
        err_console.print(f"[red]error:[/] {exc.message}", highlight=False)
        sys.exit(2 if exc.status in (400, 401, 403, 404, 409, 413, 422) else 1)


if __name__ == "__main__":
    main()

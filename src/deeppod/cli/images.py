"""Container images jobs may run in (--image NAME): those the administrator offers."""

from __future__ import annotations

import typer

from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import console, print_json, rows_table
from deeppod.units import size_text

app = typer.Typer(no_args_is_help=True, help="Container images jobs may run in (deeppod submit --image NAME).")


@app.command("ls")
def ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """The images this server offers, and whether each is unpacked on it yet."""
    found = client(url, token).images()
    if as_json:
        print_json(found)
        return
    if not found:
        console.print("this server offers no container images (an administrator puts 'podman save' archives in "
                      "DEEPPOD_IMAGE_DIR)")
        return
    console.print(rows_table([{"name": i["name"], "archive": size_text(i["archive_bytes"]),
                               "unpacked": "yes" if i["unpacked"] else "no (at its first job)"} for i in found],
                             ["name", "archive", "unpacked"]))

"""Options and the client every CLI command shares."""

from __future__ import annotations

from typing import Annotated

import typer

UrlOpt = Annotated[str | None, typer.Option("--url",
                                            help="server URL, or several comma-separated (a failover control plane: "
                                            "the first that answers); or DEEPPOD_API_URL", show_default=False)]
TokenOpt = Annotated[str | None, typer.Option("--token", help="API token (or DEEPPOD_TOKEN)", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
TimeOpt = Annotated[str | None, typer.Option(
    "--time", help="the longest one run may last, e.g. 90m, 12h or 1-12:00:00: then it is stopped as 'deeppod "
                   "stop' would (it checkpoints) and 'deeppod resume' goes on (on Slurm: its --time)",
    show_default=False)]


def client(url: str | None, token: str | None, ca_cert: str | None = None):
    from deeppod.sdk.client import Client

    return Client(url, token, ca_cert=ca_cert)

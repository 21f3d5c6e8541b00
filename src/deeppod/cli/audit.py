"""``deeppod audit``: who changed what, and who was refused (administrators)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import console, print_json, rows_table
from deeppod.cli.values import parse_age

app = typer.Typer()


@app.command("audit")
def audit(user: Annotated[str | None, typer.Option(help="only this user's calls")] = None,
          since: Annotated[str | None, typer.Option(help="only the last 30m, 12h, 7d...")] = None,
          failed: Annotated[bool, typer.Option("--failed", help="only refused or failed calls")] = False,
          path: Annotated[str | None, typer.Option(help="only paths containing this, e.g. /v1/tokens")] = None,
          limit: Annotated[int, typer.Option(help="at most this many, newest first")] = 200,
          as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """The audit log: every mutating API call and every refused one (who, what, when, from where, the answer)."""
    after = (datetime.now(UTC) - timedelta(seconds=parse_age(since, "--since"))).isoformat() if since else None
    rows = client(url, token).audit(user=user, since=after, failed=failed, path=path, limit=limit)
    if as_json:
        print_json(rows)
        return
    console.print(rows_table(rows, ["at", "user", "tenant", "method", "path", "status", "client"]))

"""Jobs' Python environments (--requirements): list, remove, prune the cache."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import console, print_json, rows_table
from deeppod.units import size_text

app = typer.Typer(no_args_is_help=True, help="Jobs' Python environments, built from --requirements and cached "
                                                     "(and the container images unpacked for --image).")


def _ago(t: float) -> str:
    s = max(0.0, time.time() - t)
    return f"{s / 86400:.1f} d" if s >= 86400 else f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min"


@app.command("ls")
def ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Your tenant's environments: key, packages, size, last used, the active jobs using it."""
    envs = client(url, token).envs()
    if as_json:
        print_json(envs)
        return
    if not envs:
        console.print("no environments yet: 'deeppod submit --requirements requirements.txt -- python train.py'")
        return
    console.print(rows_table([
        {"key": e["key"], "tenant": e["tenant"], "python": e["python"] or "default", "size": size_text(e["bytes"]),
         "last used": _ago(e["last_used"]), "active jobs": ", ".join(map(str, e["active_jobs"])) or "-",
         "packages": f"image {e['image']}" if e.get("image") else ", ".join(e["requirements"]) or "-"} for e in envs],
        ["key", "packages", "size", "last used", "active jobs", "tenant", "python"]))  # packages: cut, never hidden
    totals: dict[str, int] = {}
    for e in envs:
        totals[e["tenant"]] = totals.get(e["tenant"], 0) + e["bytes"]
    console.print("in all: " + "; ".join(f"{t} {size_text(b)}" for t, b in sorted(totals.items())))


@app.command("rm")
def rm(key: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Remove an environment (not while an active job uses it); the next job that needs it builds it again."""
    gone = client(url, token).remove_env(key)
    console.print(f"removed environment {gone['key']} ({size_text(gone['bytes'])})")


@app.command("prune")
def prune(keep: Annotated[float,
                          typer.Option(help="GB to keep (least recently used go first); 0: all not in use")] = 0.0,
          url: UrlOpt = None, token: TokenOpt = None) -> None:
    """(Admins) remove environments no active job uses, least recently used first."""
    removed = client(url, token).prune_envs(int(keep * 1e9))
    console.print(f"removed {len(removed)} environment(s){': ' + ', '.join(removed) if removed else ''}")

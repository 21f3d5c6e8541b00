"""``deeppod notebook``: JupyterLab as a job in your sandbox: start (or resume), ls, stop."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import console, print_json, rows_table
from deeppod.cli.values import parse_memory, read_requirements
from deeppod.units import duration_text, time_limit_seconds

app = typer.Typer(no_args_is_help=True, help="Notebooks: JupyterLab on the shared GPUs, in your sandbox, queued as "
                                             "a job; stopped (files kept) when idle.")


def _said(c, nb: dict) -> None:
    where = c.url.rstrip("/") + nb["url"]
    idle = duration_text(nb["idle_limit_seconds"]) if nb.get("idle_limit_seconds") else "never"
    console.print(f"notebook {nb['id']} ({nb['name']}): {nb['state']}"
                  + (f", {nb['reason']}" if nb["state"] == "queued" and nb.get("reason") else ""))
    console.print(f"open {where} (signed in to the console); stopped after {idle} without kernel activity, "
                  f"its files kept: 'deeppod notebook start --resume {nb['id']}' brings it back")


@app.command("start")
def start(gpus_per_worker: Annotated[int | None, typer.Option(help="GPUs (default: 1 where the cluster has "
                                                                    "GPUs)")] = None,
          cpus_per_worker: Annotated[float | None, typer.Option(help="CPUs (default: its GPUs' share)")] = None,
          memory: Annotated[str | None, typer.Option(help="memory, e.g. 16G (enforced)")] = None,
          requirements: Annotated[Path | None, typer.Option(
              help="a requirements.txt: the notebook's own environment (JupyterLab comes from the server's)")] = None,
          python: Annotated[str | None, typer.Option(help="its environment's Python, e.g. 3.12")] = None,
          image: Annotated[str | None, typer.Option(help="a container image the server offers (with JupyterLab "
                                                         "in it)")] = None,
          dataset: Annotated[list[str] | None, typer.Option(
              help="NAME or NAME@VERSION (repeatable), mounted as a job's (DEEPPOD_DATA_<NAME>)")] = None,
          idle: Annotated[str | None, typer.Option(help="stop it after this long without kernel or terminal "
                                                        "activity, e.g. 30m, 2h (default: the plan's)")] = None,
          name: Annotated[str | None, typer.Option(help="its name")] = None,
          resume: Annotated[int | None, typer.Option(help="bring back this stopped notebook, its files as they "
                                                          "were")] = None,
          as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Start JupyterLab as a job (it waits in the queue like one) and print where to open it."""
    c = client(url, token)
    idle_seconds = time_limit_seconds(idle, "--idle") if idle else None
    if resume is not None:
        given = [o for o, v in (("--gpus-per-worker", gpus_per_worker), ("--cpus-per-worker", cpus_per_worker),
                                ("--memory", memory), ("--requirements", requirements), ("--python", python),
                                ("--image", image), ("--dataset", dataset), ("--name", name)) if v]
        if given:
            raise typer.BadParameter(f"--resume brings notebook {resume} back as it was: leave out {', '.join(given)}"
                                     " (or start a new one)")
        nb = c.notebooks.resume(resume, idle_seconds)
    else:
        options = {"gpus_per_worker": gpus_per_worker, "cpus_per_worker": cpus_per_worker,
                   "memory_mb_per_worker": parse_memory(memory), "python": python, "image": image, "name": name,
                   "requirements": read_requirements(requirements) if requirements else None,
                   "idle_seconds": idle_seconds, "datasets": list(dataset or [])}
        nb = c.notebooks.start(**{k: v for k, v in options.items() if v is not None})
    if as_json:
        print_json(nb)
        return
    _said(c, nb)


@app.command("ls")
def ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Your notebooks (an administrator's: everyone's): state, GPUs, idle limit, where to open each."""
    c = client(url, token)
    rows = c.notebooks.list()
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no notebooks yet: 'deeppod notebook start'")
        return
    base = c.url.rstrip("/")
    console.print(rows_table([
        {"id": n["id"], "name": n["name"], "user": f"{n['user']} ({n['tenant']})", "state": n["state"],
         "gpus": n["gpus_per_worker"],
         "idle limit": duration_text(n["idle_limit_seconds"]) if n.get("idle_limit_seconds") else "-",
         "open": base + n["url"] if n["state"] == "running" else (n.get("stop_reason") or n.get("reason") or "-")}
        for n in rows], ["id", "name", "state", "gpus", "idle limit", "open", "user"]))


@app.command("stop")
def stop(notebook_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Stop a notebook; its files stay ('deeppod notebook start --resume ID')."""
    nb = client(url, token).notebooks.stop(notebook_id)
    console.print(f"notebook {nb['id']}: {nb['state']}" + (", stopping" if nb["state"] == "running" else "")
                  + f"; 'deeppod notebook start --resume {nb['id']}' brings it back")

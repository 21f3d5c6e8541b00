"""``deeppod deploy``: run a model as a service; update, roll back, keys, predict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import console, print_json, rows_table, state
from deeppod.errors import InvalidRequest


class DefaultToCreate(TyperGroup):
    """``deeppod deploy MODEL ...`` is ``deeppod deploy create MODEL ...``."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["create", *args]
        return super().resolve_command(ctx, args)


app = typer.Typer(cls=DefaultToCreate, no_args_is_help=True,
                  help="Deploy a model as a service: deploy NAME (or NAME@VERSION, NAME@ALIAS), update, rollback, ls, "
                  "show, rm.")
key_app = typer.Typer(no_args_is_help=True, help="Per-deployment keys: call predict without a tenant token.")
app.add_typer(key_app, name="key")


def _summary(d: dict) -> str:
    reps = d["replica_jobs"]
    healthy = sum(1 for r in reps if r["routed"])
    return (f"{d['name']}: {d['model']}@{d['version']} {state(d['state'])} ({d['reason']}); "
            f"{healthy} of {d['replicas']} replicas taking traffic")


def curl_line(predict_url: str) -> str:
    """A command that works when pasted: the token comes from the same place the CLI's does."""
    return f'curl -H "Authorization: Bearer $(deeppod tokens current)" -F image=@picture.jpg {predict_url}'


def _wait(c, name: str, version: int | None, timeout: float) -> None:
    with console.status(f"waiting for {name} to be ready"):
        d = c.deployments.wait(name, version=version, timeout=timeout)
    console.print(_summary(d))
    console.print(f"predict: {curl_line(d['predict_url'])}", highlight=False, soft_wrap=True)
    console.print(f"try it in the console: {d['page_url']}")


@app.command("create")
def create(model: Annotated[str, typer.Argument(help="NAME, NAME@VERSION or NAME@ALIAS")],
           name: Annotated[str | None, typer.Option(help="deployment name (default: the model's)")] = None,
           replicas: int = 1, gpus_per_replica: int = 0, cpus_per_replica: float = 1.0,
           max_batch: Annotated[int, typer.Option(help="largest batch a replica forms")] = 32,
           max_wait_ms: Annotated[float, typer.Option(help="longest a request waits for a batch to fill")] = 5.0,
           wait: Annotated[bool, typer.Option("--wait/--no-wait")] = True, timeout: float = 600.0,
           url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Run MODEL as a service: replicas are non-preemptible jobs, restarted if they die."""
    c = client(url, token)
    d = c.deployments.create(model, name=name, replicas=replicas, gpus_per_replica=gpus_per_replica,
                 cpus_per_replica=cpus_per_replica, max_batch=max_batch, max_wait_ms=max_wait_ms)
    console.print(f"deployment {d['name']} created: {d['model']}@{d['version']} x{d['replicas']}")
    if wait:
        _wait(c, d["name"], None, timeout)


@app.command("update")
def update(name: str, version: Annotated[str | None, typer.Option(help="version number or alias")] = None,
           replicas: int | None = None, max_batch: int | None = None, max_wait_ms: float | None = None,
           wait: Annotated[bool, typer.Option("--wait/--no-wait")] = True, timeout: float = 600.0,
           url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Rolling update: new replicas start, become healthy, take the traffic; the old drain and stop."""
    if version is None and replicas is None and max_batch is None and max_wait_ms is None:
        raise InvalidRequest("say what to change: --version, --replicas, --max-batch or --max-wait-ms")
    c = client(url, token)
    d = c.deployments.update(name, version=version, replicas=replicas, max_batch=max_batch, max_wait_ms=max_wait_ms)
    console.print(f"{name}: rolling out {d['model']}@{d['version']}")
    if wait:
        _wait(c, name, d["version"], timeout)


@app.command("rollback")
def rollback(name: str, wait: Annotated[bool, typer.Option("--wait/--no-wait")] = True, timeout: float = 600.0,
             url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Return to the version served before the last update (rolling, like an update)."""
    c = client(url, token)
    d = c.deployments.rollback(name)
    console.print(f"{name}: rolling back to {d['model']}@{d['version']}")
    if wait:
        _wait(c, name, d["version"], timeout)


@app.command("ls")
def ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    deps = client(url, token).deployments()
    if as_json:
        print_json(deps)
        return
    console.print(rows_table([{"name": d["name"], "model": f"{d['model']}@{d['version']}", "state": state(d["state"]),
                               "replicas": f"{sum(r['routed'] for r in d['replica_jobs'])}/{d['replicas']}",
                               "batch": f"{d['max_batch']} / {d['max_wait_ms']:g} ms", "reason": d["reason"]}
                              for d in deps], ["name", "model", "state", "replicas", "batch", "reason"]))


@app.command("show")
def show(name: str, as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    d = client(url, token).deployments.get(name)
    if as_json:
        print_json(d)
        return
    console.print(_summary(d))
    console.print(rows_table([{"job": r["job_id"], "version": r["version"], "state": state(r["state"]),
                               "endpoint": r["endpoint"] or "-", "traffic": "yes" if r["routed"] else "",
                               "inflight": r["inflight"], "restarts": r["restarts"]} for r in d["replica_jobs"]],
                             ["job", "version", "state", "endpoint", "traffic", "inflight", "restarts"]))
    console.print(f"predict: {d['predict_url']}\ntry it in the console: {d['page_url']}")


@app.command("rm")
def rm(name: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    client(url, token).deployments.delete(name)
    console.print(f"deployment {name} removed; its replicas are stopping")


@app.command("predict")
def predict(name: str, images: Annotated[list[Path], typer.Argument(help="image files")],
            top_k: int = 3, direct: Annotated[bool, typer.Option(
                "--direct", help="send to the replicas with a direct token, past the control plane")] = False,
            as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Send images to a deployment and print the answers."""
    for p in images:
        if not p.is_file():
            raise InvalidRequest(f"{p} is not a file")
    c, data = client(url, token), [p.read_bytes() for p in images]
    if direct:
        with c.deployments.direct(name) as d:
            r = d.predict(data, top_k=top_k)
    else:
        r = c.deployments.predict(name, data, top_k=top_k)
    if as_json:
        print(json.dumps(r, indent=1))
        return
    for p, ans in zip(images, r["predictions"]):
        others = ", ".join(f"{x['label']} {x['confidence']:.1%}" for x in ans["top_k"][1:])
        console.print(f"{p.name}: [bold]{ans['label']}[/] {ans['confidence']:.1%}" + (f" ({others})" if others else "")
                      + f"  [dim]v{r['version']}[/]")


@app.command("direct")
def direct_token(name: str, ttl: Annotated[float, typer.Option(help="seconds the token lasts (at most a day)")] = 600.0,
                 revoke: Annotated[bool, typer.Option("--revoke", help="revoke every direct token of NAME")] = False,
                 as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A token to call NAME's replicas directly, past the control plane (the Python SDK's
    Client.direct(NAME) renews it and spreads calls by itself)."""
    c = client(url, token)
    if revoke:
        revoked = c.deployments.revoke_direct(name)["revoked"]
        console.print(f"{revoked} direct tokens of {name} revoked; replicas refuse them within a second")
        return
    g = c.deployments.direct_token(name, ttl=ttl)
    if as_json:
        print_json(g)
        return
    console.print(f"direct token {g['token_id']} for {name}, valid for {ttl:g} s:\n  {g['token']}", soft_wrap=True)
    for r in g["replicas"]:
        console.print(f"  curl -H 'Authorization: Bearer {g['token']}' -F image=@picture.jpg {r['url']}/predict",
                      highlight=False, soft_wrap=True)
    if not g["replicas"]:
        console.print(f"no replica of {name} takes traffic now: see 'deeppod deploy show {name}'")


@key_app.command("create")
def key_create(name: str, label: Annotated[str, typer.Option("--label")] = "",
               url: UrlOpt = None, token: TokenOpt = None) -> None:
    k = client(url, token).deployments.create_key(name, label)
    console.print(f"key {k['id']} for {name} (shown once):\n  {k['key']}\n"
                  f"call predict with the header 'X-DeepPod-Key: {k['key']}'")


@key_app.command("ls")
def key_ls(name: str, as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    keys = client(url, token).deployments.keys(name)
    if as_json:
        print_json(keys)
        return
    console.print(rows_table([{"id": k["id"], "label": k["name"], "created": k["created_at"][:19],
                               "revoked": (k["revoked_at"] or "")[:19]} for k in keys],
                             ["id", "label", "created", "revoked"]))


@key_app.command("revoke")
def key_revoke(name: str, key_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Revoke a key: predict refuses it within one controller round (about a second)."""
    client(url, token).deployments.revoke_key(name, key_id)
    console.print(f"key {key_id} of {name} revoked")

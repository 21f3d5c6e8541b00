"""``deeppod models``: register, list, aliases, compare, promote."""

from __future__ import annotations

from typing import Annotated

import typer

from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import console, print_json, rows_table
from deeppod.contract import JobState
from deeppod.errors import InvalidRequest
from deeppod.units import size_text

app = typer.Typer(no_args_is_help=True, help="Model registry: versions, lineage, aliases, champion/challenger.")


def _pct(v) -> str:
    return "-" if v is None else f"{v:.2%}"


@app.command("register")
def register(name: str,
             from_job: Annotated[int | None, typer.Option("--from-job",
                                                          help="a job whose JOB_DIR/model to register")] = None,
             path: Annotated[str | None, typer.Option(help="an artifact folder on the server instead: model.pt2 + "
                                                          "signature.json, or a Hugging Face model folder "
                                                          "(config.json, safetensors, tokenizer)")] = None,
             alias: Annotated[list[str], typer.Option("--alias",
                                                      help="point this alias at the new version (repeat)")] = [],
             description: str | None = None, as_json: JsonOpt = False,
             url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Register a model version: its artifact, signature, metrics and lineage."""
    if from_job is None and path is None:
        raise InvalidRequest("say where the model is: --from-job JOB_ID or --path FOLDER")
    v = client(url, token).models.register(name, job_id=from_job, path=path, description=description, aliases=alias)
    if as_json:
        print_json(v)
        return
    acc = v["metrics"].get("val_accuracy")
    if v["signature"].get("kind") == "causal-lm":
        acc = None
        console.print(f"{v['ref']}: {_model_text(v['signature'])}")
    console.print(f"registered {v['ref']}" + (f" (val_accuracy {_pct(acc)})" if acc is not None else "")
                  + (f", aliases: {', '.join(v['aliases'])}" if v["aliases"] else ""))


@app.command("ls")
def ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    models = client(url, token).models()
    if as_json:
        print_json(models)
        return
    rows = []
    for m in models:
        latest = m["versions"][-1] if m["versions"] else None
        rows.append({"name": m["name"], "owner": m["owner"], "versions": len(m["versions"]),
                     "latest": f"@{latest['version']}" if latest else "-",
                     "aliases": " ".join(f"{a}=@{n}" for a, n in sorted(m["aliases"].items())),
                     "val_accuracy": _pct(latest["metrics"].get("val_accuracy")) if latest else "-"})
    console.print(rows_table(rows, ["name", "owner", "versions", "latest", "aliases", "val_accuracy"]))


@app.command("show")
def show(name: str, as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Versions with their lineage and metrics, aliases, and comparison figures."""
    m = client(url, token).models.get(name)
    if as_json:
        print_json(m)
        return
    console.print(f"[bold]{m['name']}[/] (owner {m['owner']}) {m['description']}")
    rows = []
    for v in m["versions"]:
        lin = v["lineage"]
        rows.append({"version": v["version"], "aliases": ",".join(v["aliases"]),
                     "val_accuracy": _pct(v["metrics"].get("val_accuracy")),
                     "job": lin.get("job_id") or "-", "dataset": lin.get("dataset") or "-",
                     "model": _model_text(v["signature"]), "classes": len(v["signature"].get("classes", [])),
                     "size": size_text(v['bytes']), "created": v["created_at"][:19]})
    console.print(rows_table(rows, ["version", "aliases", "val_accuracy", "job", "dataset", "model", "classes",
                                    "size", "created"]))
    if m["evaluations"]:
        console.print("comparisons:")
        console.print(rows_table([{"job": e["job_id"], "version": e["version"], "data": e["dataset"],
                                   "images": e["samples"], "accuracy": _pct(e["accuracy"])} for e in m["evaluations"]],
                                 ["job", "version", "data", "images", "accuracy"]))


def _model_text(sig: dict) -> str:
    if sig.get("kind") == "causal-lm":
        return f"{sig['architecture']} {sig['parameters']:,} params, context {sig['context_length']}"
    return sig.get("model", "-")


@app.command("alias")
def alias(name: str, alias_: Annotated[str, typer.Argument(metavar="ALIAS")],
          version: Annotated[str | None, typer.Argument(help="version number or alias")] = None,
          rm: Annotated[bool, typer.Option("--rm", help="remove the alias")] = False,
          url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Point ALIAS (champion, challenger, staging, ...) at a version, or remove it with --rm."""
    if (version is None) != rm:
        raise InvalidRequest("give a VERSION to point the alias at, or --rm to remove it")
    m = client(url, token).models.set_alias(name, alias_, None if rm else version)
    console.print(f"{name}: " + (" ".join(f"{a}=@{n}" for a, n in sorted(m["aliases"].items())) or "no aliases"))


def comparison_table(c: dict):
    by_version = {e["version"]: e for e in c["evaluations"]}
    a, b = by_version.get(c["a"]), by_version.get(c["b"])
    rows = [{"": "accuracy", f"v{c['a']}": _pct(a and a["accuracy"]), f"v{c['b']}": _pct(b and b["accuracy"])},
            {"": "images", f"v{c['a']}": a and a["samples"], f"v{c['b']}": b and b["samples"]}]
    classes = sorted(set((a or {}).get("per_class", {})) | set((b or {}).get("per_class", {})))
    for cls in classes:
        pa, pb = (a or {}).get("per_class", {}).get(cls, {}), (b or {}).get("per_class", {}).get(cls, {})
        rows.append({"": f"class {cls} ({pa.get('samples', pb.get('samples', 0))})",
                     f"v{c['a']}": f"acc {_pct(pa.get('accuracy'))} prec {_pct(pa.get('precision'))}",
                     f"v{c['b']}": f"acc {_pct(pb.get('accuracy'))} prec {_pct(pb.get('precision'))}"})
    return rows_table(rows, ["", f"v{c['a']}", f"v{c['b']}"])


@app.command("compare")
def compare(name: str, a: str, b: str,
            data: Annotated[str, typer.Option("--data", help="held-out data: DATASET@VERSION")],
            wait: Annotated[bool, typer.Option("--wait/--no-wait",
                                               help="wait for the job and print the figures")] = True,
            timeout: float = 1800.0, as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Evaluate versions A and B on the same data, as a job: accuracy and per-class figures side by side."""
    c = client(url, token)
    started = c.models.compare(name, a, b, data)
    if not wait:
        console.print(f"comparison job {started['job_id']} submitted; see it with "
                      f"'deeppod models show {name}' when it ends")
        return
    job = c.jobs.wait(started["job_id"], timeout=timeout)
    result = c.models.comparison(name, started["job_id"])
    if as_json:
        print_json(result)
        return
    if job["state"] != JobState.SUCCEEDED:
        raise InvalidRequest(f"the comparison job {job['id']} {job['state']}: {job['reason']} "
                             f"(see 'deeppod logs {job['id']}')")
    console.print(f"{name}: v{result['a']} vs v{result['b']} on {result['data']} (job {result['job_id']})")
    console.print(comparison_table(result))


@app.command("promote")
def promote(name: str, version: str,
            force: Annotated[bool, typer.Option("--force", help="promote even if it did not win")] = False,
            url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Make VERSION the champion, if it beat the champion in their latest comparison."""
    r = client(url, token).models.promote(name, version, force=force)
    console.print(f"{name}: champion is now v{r['champion']} ({r['reason']})")


@app.command("rm")
def rm(ref: Annotated[str, typer.Argument(help="NAME@VERSION (or NAME@ALIAS) for one version, NAME for all")],
       url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Delete a model version (or the whole model) with its artifact and figures. Refused while a
    deployment serves it."""
    removed = client(url, token).models.remove(ref)
    console.print(f"removed {ref.split('@')[0]} version(s) {', '.join(map(str, removed))}")

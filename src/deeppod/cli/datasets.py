"""``deeppod data``: ingest, catalog, policies, tiers."""

from __future__ import annotations

from typing import Annotated

import typer

from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import console, print_json, rows_table
from deeppod.errors import InvalidRequest
from deeppod.units import size_text

app = typer.Typer(no_args_is_help=True, help="Datasets: ingest, versions, catalog and search, policies, tiers.")
policy_app = typer.Typer(no_args_is_help=True, help="Ingest policies: what every new version gets done to it.")
app.add_typer(policy_app, name="policy")


def pairs(value) -> str:
    """A dict as 'k=v, k=v' (a bare key for an empty value), a list as 'a, b'; '-' when empty."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={pairs(v)}" if v not in ("", None) else str(k) for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(pairs(v) for v in value) or "-"
    return "-" if value in (None, "") else str(value)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not k:
            raise InvalidRequest(f"{what} {item!r}: write KEY=VALUE (or KEY)")
        out[k] = v
    return out


def parse_assignments(items: list[str]) -> dict:
    """["resize=short:256", "format=jpeg,quality=85"] -> dict; the server checks the values."""
    out = {}
    for item in items:
        for part in item.split(","):
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise InvalidRequest(f"policy item {part!r} is not KEY=VALUE (e.g. resize=short:256)")
            out[key.strip().replace("-", "_")] = value.strip()
    return out


def _summary_rows(datasets: list[dict]) -> list[dict]:
    rows = []
    for d in datasets:
        latest = d["versions"][-1] if d["versions"] else None
        rows.append({"name": d["name"], "owner": d["owner"], "versions": len(d["versions"]),
                     "latest": f"@{latest['version']}" if latest else "-",
                     "samples": latest["samples"] if latest else 0, "classes": len(latest["classes"]) if latest else 0,
                     "size": size_text(latest["bytes"]) if latest else "-", "tier": latest["tier"] if latest else "-",
                     "tags": " ".join(f"{k}={v}" if v else k for k, v in d["tags"].items()),
                     "shared": "yes" if d["shared"] else ""})
    return rows


COLUMNS = ["name", "owner", "versions", "latest", "samples", "classes", "size", "tier", "tags", "shared"]


def upload_bar(source: str, out=None):
    """A progress bar in bytes, and the callback the SDK's ingest calls. Files are counted in
    the description only when the source knows them (a folder or an S3 prefix does; an
    archive is sent as it is)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   console=out or console, transient=out is None)
    task = bar.add_task(f"uploading {source}", total=None)

    def progress(files_done, files_total, bytes_done, bytes_total):
        bar.update(task, completed=bytes_done, total=bytes_total or None,
                   description=f"uploading {files_done}/{files_total} files" if files_total else f"uploading {source}")

    return bar, progress


@app.command("ingest")
def ingest(
    name: str,
    source: Annotated[str, typer.Argument(help="a folder (class folders, or images + labels.csv/labels.jsonl), "
                                               "a .zip/.tar/.tar.gz, a .jsonl file of text examples, "
                                               "or s3://bucket/prefix")],
    policy: Annotated[list[str], typer.Option("--policy", help="KEY=VALUE for this and later versions, e.g. "
                                                                "resize=short:256 format=jpeg tile=512")] = [],
    split: Annotated[str | None, typer.Option(help="validation split, e.g. val=0.1")] = None,
    tag: Annotated[list[str], typer.Option("--tag", help="KEY=VALUE or KEY")] = [],
    description: str | None = None,
    s3_endpoint: Annotated[str | None, typer.Option(help="S3 endpoint URL (or DEEPPOD_S3_ENDPOINT)")] = None,
    s3_key_id: Annotated[str | None, typer.Option(help="access key (or AWS_ACCESS_KEY_ID)")] = None,
    s3_secret: Annotated[str | None, typer.Option(help="secret key (or AWS_SECRET_ACCESS_KEY)")] = None,
    as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Ingest SOURCE as the next version of dataset NAME (all or nothing)."""
    pol = parse_assignments(policy)
    if split:
        key, _, value = split.partition("=")
        if key != "val" or not value:
            raise InvalidRequest(f"--split {split!r}: write val=FRACTION, e.g. --split val=0.1")
        pol["val"] = value
    bar, progress = upload_bar(source)
    with bar:
        result = client(url, token).datasets.ingest(name, source, policy=pol or None, tags=_pairs(tag, "--tag") or None,
                                           description=description, progress=progress, s3_endpoint=s3_endpoint,
                                           s3_key_id=s3_key_id, s3_secret=s3_secret)
    v = result["versions"][-1]
    if as_json:
        print_json(v)
        return
    lin = v["lineage"]
    if v["stats"].get("kind") == "text":
        st = v["stats"]
        console.print(f"[bold]{v['ref']}[/bold]: {v['samples']} {st.get('format')} examples, "
                      f"{size_text(v['bytes'])} ({st.get('duplicates', 0)} duplicate line(s) dropped)")
    else:
        console.print(f"[bold]{v['ref']}[/bold]: {v['samples']} images, {len(v['classes'])} classes, "
                      f"{size_text(v['bytes'])}"
                      f" ({lin.get('new_objects', 0)} new since the last version, {lin.get('deduplicated', 0)} the "
                      "same, stored once)")
    split_counts = v["stats"].get("per_split", {})
    console.print("split: " + ", ".join(f"{k} {n}" for k, n in sorted(split_counts.items())))
    if v["quarantined"]:
        what = "line(s)" if v["stats"].get("kind") == "text" else "file(s)"
        console.print(f"[yellow]{len(v['quarantined'])} {what} quarantined[/yellow]:")
        for q in v["quarantined"][:20]:
            console.print(f"  {q['path']}: {q['reason']}")
        if len(v["quarantined"]) > 20:
            console.print(f"  ... see 'deeppod data show {v['ref']} --json'")
    missing = v.get("labels_without_file") or []
    if missing:
        console.print(f"[yellow]{len(missing)} row(s) of the labels file name no file in the source[/yellow]: "
                      + ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""), highlight=False)


@app.command("commit")
def commit(name: Annotated[str, typer.Argument(help="the dataset whose S3 inbox (s3://inbox/NAME/) to ingest")],
           url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Turn the files put in the dataset's S3 inbox into its next version (the same ingest as
    'deeppod data ingest'); what the ingest refuses stays in the inbox."""
    ds = client(url, token).commit(name)
    latest = ds["versions"][-1] if ds.get("versions") else {}
    console.print(f"{name}@{latest.get('version', '?')}: {latest.get('samples', '?')} images from the inbox")


@app.command("ls")
def ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """The datasets you can see: your tenant's and shared ones."""
    rows = client(url, token).datasets()
    if as_json:
        print_json(rows)
        return
    console.print(rows_table(_summary_rows(rows), COLUMNS))


@app.command("search")
def search(query: Annotated[str, typer.Argument(help="e.g. 'tag:xray classes>10 size<2GB owner:teama'")],
           as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Find datasets by tag, owner, name, class count, size, sample count or words."""
    rows = client(url, token).datasets(query)
    if as_json:
        print_json(rows)
        return
    console.print(rows_table(_summary_rows(rows), COLUMNS) if rows else "no dataset matches")


@app.command("show")
def show(ref: Annotated[str, typer.Argument(help="NAME or NAME@VERSION")], as_json: JsonOpt = False,
         url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A dataset's versions, or one version's statistics, lineage and quarantine report."""
    d = client(url, token).datasets.get(ref)
    want = ref.split("@")[1] if "@" in ref else None
    versions = [v for v in d["versions"] if want is None or str(v["version"]) == want]
    if want and not versions:
        raise InvalidRequest(f"{d['name']} has no version {want}")
    if as_json:
        print_json({**d, "versions": versions})
        return
    console.print(f"[bold]{d['owner']}/{d['name']}[/bold]  {d['description']}", highlight=False)
    console.print(f"tags: {pairs(d['tags'])}  shared: {'yes' if d['shared'] else 'no'}  policy: {pairs(d['policy'])}",
                  highlight=False)
    if want is None:
        console.print(rows_table([{"version": v["ref"], "samples": v["samples"], "classes": len(v["classes"]),
                                   "size": size_text(v["bytes"]), "tier": v["tier"],
                                   "quarantined": len(v["quarantined"]), "parent": v["lineage"].get("parent") or "-",
                                   "created": v["created_at"][:19]} for v in versions],
                                 ["version", "samples", "classes", "size", "tier", "quarantined", "parent", "created"]))
        return
    v = versions[0]
    s = v["stats"]
    if s.get("kind") == "text":
        console.print(f"{v['ref']}: {v['samples']} {s.get('format')} examples, {size_text(v['bytes'])}, "
                      f"tier {v['tier']}")
        console.print("per split: " + ", ".join(f"{k} {n}" for k, n in s.get("per_split", {}).items()))
        console.print(f"characters per example: {pairs(s.get('characters'))}  duplicates dropped: "
                      f"{s.get('duplicates', 0)}", highlight=False)
        if s.get("turns"):
            console.print(f"turns: {pairs(s['turns'])}  roles: {pairs(s.get('roles'))}", highlight=False)
    else:
        console.print(f"{v['ref']}: {v['samples']} images, {size_text(v['bytes'])}, tier {v['tier']}")
        console.print("per class: " + ", ".join(f"{c} {n}" for c, n in s.get("per_class", {}).items()))
        console.print("per split: " + ", ".join(f"{k} {n}" for k, n in s.get("per_split", {}).items()))
        console.print("sizes: " + ", ".join(f"{k} {n}" for k, n in s.get("size_histogram", {}).items() if n))
        console.print(f"width: {pairs(s.get('width'))}  height: {pairs(s.get('height'))}  "
                      f"formats: {pairs(s.get('formats'))}", highlight=False)
    console.print("lineage:")
    for key, value in (v["lineage"] or {}).items():
        console.print(f"  {key}: {pairs(value)}", highlight=False)
    for q in v["quarantined"]:
        console.print(f"[yellow]quarantined[/yellow] {q['path']}: {q['reason']}")


@app.command("tokens")
def tokens(ref: Annotated[str, typer.Argument(help="NAME@VERSION of a text dataset")],
           model: Annotated[str, typer.Option("--model", help="NAME@VERSION of a registered language model: its "
                                                             "tokenizer counts")],
           as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """How long a text dataset's examples are in a language model's tokens, and how many would
    not fit its context."""
    t = client(url, token).datasets.token_counts(ref, model)
    if as_json:
        print_json(t)
        return
    cut = f" (the first {t['cut_at']} of each split)" if t["cut_at"] else ""
    console.print(f"{t['dataset']} in {t['model']}'s tokens: {t['tokens']:,} in {t['examples']} examples{cut}; "
                  + ", ".join(f"{k} {x['tokens']:,}" for k, x in t["per_split"].items()), highlight=False)
    console.print(f"per example: {pairs(t['per_example'])}" + ("  (through its chat template)"
                                                                if t["chat_template"] else ""), highlight=False)
    console.print("histogram: " + ", ".join(f"{k} {n}" for k, n in t["histogram"].items()), highlight=False)
    if t["over_context"]:
        console.print(f"[yellow]{t['over_context']} example(s) exceed its {t['context_length']}-token context[/yellow]")
    else:
        console.print(f"all fit its {t['context_length']}-token context")


@app.command("rm")
def rm(ref: Annotated[str, typer.Argument(help="NAME@VERSION")], url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Delete one version and the stored images no other version names. Refused while a job or
    a registered model version uses it."""
    r = client(url, token).datasets.remove_version(ref)
    console.print(f"removed {r['ref']} ({r['objects_removed']} stored images freed)")


@app.command("diff")
def diff(a: Annotated[str, typer.Argument(help="NAME@VERSION")], b: Annotated[str, typer.Argument(help="NAME@VERSION")],
         limit: Annotated[int, typer.Option(help="files listed per kind of change")] = 20,
         as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """What changed from A to B: files added, removed, relabelled or re-encoded, and per class."""
    from deeppod.cli.datadiff import diff_manifests

    c = client(url, token)
    d = diff_manifests(c.datasets.manifest(a), c.datasets.manifest(b))
    if as_json:
        print_json(d)
        return
    console.print(f"{a} -> {b}: {len(d['added'])} added, {len(d['removed'])} removed, "
                  f"{len(d['relabelled'])} relabelled, {len(d['changed'])} changed content, {d['same']} the same",
                  highlight=False)
    for kind, mark in (("added", "+"), ("removed", "-"), ("relabelled", "~"), ("changed", "*")):
        for row in d[kind][:limit]:
            console.print(f"  {mark} {row}", highlight=False)
        if len(d[kind]) > limit:
            console.print(f"  ... {len(d[kind]) - limit} more {kind} (--limit, --json)")
    if d["per_class"]:
        console.print(rows_table([{"class": k, "before": x, "after": y, "change": f"{y - x:+d}"}
                                  for k, (x, y) in d["per_class"].items()], ["class", "before", "after", "change"]))


@app.command("tag")
def tag(name: str, tags: Annotated[list[str], typer.Argument(help="KEY=VALUE or KEY; -KEY removes")],
        url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Add, change or remove tags."""
    add = _pairs([t for t in tags if not t.startswith("-")], "tag")
    d = client(url, token).datasets.update(name, tags=add, untag=[t[1:] for t in tags if t.startswith("-")])
    console.print(f"{d['name']} tags: {d['tags']}")


@app.command("share")
def share(name: str, off: Annotated[bool, typer.Option("--off", help="make it private again")] = False,
          url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Let every tenant read (not change) a dataset."""
    d = client(url, token).datasets.update(name, shared=not off)
    console.print(f"{d['name']} is {'shared with every tenant' if d['shared'] else 'private to ' + d['owner']}")


@app.command("stage")
def stage(ref: Annotated[str, typer.Argument(help="NAME@VERSION")],
          tier: Annotated[str, typer.Option(help="hot (default) or cold")] = "hot",
          url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Bring a version to the hot tier (or send it to cold): copy, verify, switch, delete."""
    r = client(url, token).datasets.stage(ref, tier)
    console.print(f"{r['ref']} is on the {r['tier']} tier: {r['path']}")


@policy_app.command("set")
def policy_set(name: str, items: Annotated[list[str], typer.Argument(help="KEY=VALUE: resize=max:1024|short:256, "
                                                                         "format=keep|jpeg|png|webp, quality=90, "
                                                                         "mode=keep|RGB|L, tile=512, val=0.1, "
                                                                         "split_seed=0")],
               replace: Annotated[bool, typer.Option(help="replace the whole policy")] = False,
               url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Set the ingest policy applied to every new version of NAME."""
    d = client(url, token).datasets.set_policy(name, parse_assignments(items), replace=replace)
    console.print(f"{d['name']} policy: {d['policy']}")


@policy_app.command("show")
def policy_show(name: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    d = client(url, token).datasets.get(name)
    console.print(f"{d['name']} policy: {d['policy'] or 'none (images are stored as uploaded)'}")

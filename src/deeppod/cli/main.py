"""``deeppod``: the command line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from deeppod.cli.data import app as data_app
from deeppod.cli.deploy import app as deploy_app
from deeppod.cli.models import app as models_app
from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.contract import FINAL_STATES, JobState
from deeppod.cli.output import console, err_console, jobs_table, nodes_table, print_json, rows_table, state
from deeppod.errors import DeepPodError, InvalidRequest
from deeppod.settings import ClientSettings, client_config_path

app = typer.Typer(no_args_is_help=True, add_completion=True,
                  help="DeepPod: shared GPUs, bring-your-own-framework jobs. Shell completion: "
                       "deeppod --install-completion")
job_app = typer.Typer(no_args_is_help=True, help="One job: show, events.")
jobs_app = typer.Typer(invoke_without_command=True, help="List jobs; remove finished jobs' files (rm, purge).")
tenants_app = typer.Typer(no_args_is_help=True, help="Tenants (admins).")
users_app = typer.Typer(no_args_is_help=True, help="Users (admins create them).")
tokens_app = typer.Typer(no_args_is_help=True, help="API tokens.")
nodes_app = typer.Typer(help="Nodes and GPUs: list, cordon, uncordon.", invoke_without_command=True)
plan_app = typer.Typer(no_args_is_help=True, help="Resource plans: guaranteed GPUs, borrowing caps, weights.")
app.add_typer(job_app, name="job")
app.add_typer(jobs_app, name="jobs")
app.add_typer(tenants_app, name="tenants")
app.add_typer(users_app, name="users")
app.add_typer(tokens_app, name="tokens")
app.add_typer(plan_app, name="plan")
app.add_typer(nodes_app, name="nodes")
app.add_typer(data_app, name="data")
app.add_typer(models_app, name="models")
app.add_typer(deploy_app, name="deploy")



def _print_version(value: bool) -> None:
    if value:
        from deeppod import __version__

        console.print(f"deeppod {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """DeepPod: shared GPUs, bring-your-own-framework jobs. Shell completion: deeppod --install-completion"""


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidRequest(f"--env {pair!r} is not KEY=VALUE")
        env[key] = value
    return env


def exported_env() -> dict[str, str]:
    """Like Slurm's default export: the job finds the same programs as your shell
    (e.g. your virtual environment's python)."""
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    if os.environ.get("VIRTUAL_ENV"):
        env["VIRTUAL_ENV"] = os.environ["VIRTUAL_ENV"]
    return env


def parse_workers(value: str) -> tuple[int, int | None]:
    """'2' -> (2, None); '2:8' -> (2, 8)."""
    low, sep, high = value.partition(":")
    try:
        return int(low), (int(high) if sep else None)
    except ValueError:
        raise InvalidRequest(f"--workers {value!r} is not N or MIN:MAX (e.g. 2 or 2:8)") from None


def parse_stop_rules(nan_metric: str | None, patience: str | None) -> list[dict]:
    rules = []
    if nan_metric:
        rules.append({"kind": "nan", "metric": nan_metric})
    if patience:
        parts = patience.split(":")
        try:
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("min", "max")):
                raise ValueError
            rules.append({"kind": "plateau", "metric": parts[0], "patience": int(parts[1]),
                          "mode": parts[2] if len(parts) == 3 else "min"})
        except ValueError:
            raise InvalidRequest(f"--stop-patience {patience!r} is not METRIC:P or METRIC:P:max") from None
    return rules


def parse_memory(value: str | None) -> int | None:
    """'512', '512M', '4G' -> MiB."""
    if value is None:
        return None
    v = value.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}.get(v[-1:], None)
    try:
        return int(float(v[:-1]) * mult) if mult else int(v)
    except ValueError:
        raise InvalidRequest(f"--memory {value!r} is not a size: use e.g. 512M or 4G") from None


@app.command()
def server(
    host: Annotated[Optional[str], typer.Option(help="address to listen on (default 127.0.0.1)")] = None,
    port: Annotated[Optional[int], typer.Option(help="port (default 7447)")] = None,
    home: Annotated[Optional[Path], typer.Option(help="state folder (DEEPPOD_HOME, default ~/.deeppod)")] = None,
    gpus: Annotated[Optional[int], typer.Option(help="logical GPU slots instead of the real GPUs (CPU machines)")] = None,
    cpus: Annotated[Optional[int], typer.Option(help="CPUs this node offers to jobs (default: all)")] = None,
    memory: Annotated[Optional[str], typer.Option(help="memory this node offers to jobs, e.g. 16G (default: all)")] = None,
    database_url: Annotated[Optional[str], typer.Option(help="SQLAlchemy URL (DEEPPOD_DATABASE_URL); default SQLite in home")] = None,
    hot_dir: Annotated[Optional[Path], typer.Option(help="fast storage for datasets in use (DEEPPOD_HOT_DIR)")] = None,
    cold_dir: Annotated[Optional[Path], typer.Option(help="capacity storage for idle datasets (DEEPPOD_COLD_DIR)")] = None,
) -> None:
    """Start the control plane: API, scheduler loop and local executor."""

    from deeppod.server import configure_logging, serve
    from deeppod.settings import Settings

    settings = Settings.from_env().with_overrides(
        host=host, port=port, home=home.expanduser().resolve() if home else None, gpus=gpus, cpus=cpus,
        memory_mb=parse_memory(memory), database_url=database_url,
        hot_dir=hot_dir.expanduser().resolve() if hot_dir else None,
        cold_dir=cold_dir.expanduser().resolve() if cold_dir else None)
    configure_logging(settings.log_level)
    serve(settings, echo=lambda line: console.print(line, highlight=False, soft_wrap=True))


@app.command()
def login(url: Annotated[str, typer.Option(help="server URL")],
          token: Annotated[str, typer.Option(help="API token")]) -> None:
    """Check a URL and token and save them for later commands."""
    me = client(url, token).whoami()
    path = client_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url.rstrip("/"), "token": token}, f)
    console.print(f"logged in to {url} as {me['user']} (tenant {me['tenant']}{', admin' if me['is_admin'] else ''}); "
                  f"saved to {path}")


@app.command()
def whoami(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Who the token belongs to."""
    me = client(url, token).whoami()
    console.print(f"{me['user']} (tenant {me['tenant']}{', admin' if me['is_admin'] else ''})")


@app.command(context_settings={"allow_interspersed_args": False})
def submit(
    command: Annotated[list[str], typer.Argument(help="the command each worker runs, after '--'")],
    name: Annotated[Optional[str], typer.Option(help="job name (default: the script's name)")] = None,
    workers: Annotated[str, typer.Option("--workers", "-n", help="worker processes: N, or MIN:MAX for an elastic job")] = "1",
    gpus_per_worker: Annotated[Optional[int], typer.Option(
        help="GPUs per worker (default: 1 when the cluster has GPUs, else 0; pass 0 for a CPU-only job)",
        show_default=False)] = None,
    cpus_per_worker: Annotated[Optional[float], typer.Option(
        help="CPUs per worker (default: a GPU node's CPUs per GPU for each GPU, so CPUs never leave a GPU "
             "idle; 1 for a CPU-only worker)", show_default=False)] = None,
    memory: Annotated[Optional[str], typer.Option(help="memory per worker, e.g. 4G (enforced)")] = None,
    env: Annotated[list[str], typer.Option("--env", "-e", help="KEY=VALUE for every worker (repeatable)")] = [],  # noqa: B006
    workdir: Annotated[Optional[Path], typer.Option(help="working directory (default: here)")] = None,
    priority: Annotated[int, typer.Option(help="higher runs first within your tenant")] = 0,
    grace: Annotated[Optional[float], typer.Option(help="seconds between SIGTERM and SIGKILL on cancel")] = None,
    preemptible: Annotated[bool, typer.Option("--preemptible/--no-preemptible",
                                              help="may be preempted to give GPUs back to their owners")] = True,
    max_restarts: Annotated[int, typer.Option(help="requeue after a worker or node failure up to this many times")] = 0,
    stop_on_nan: Annotated[Optional[str], typer.Option(help="stop gracefully when this reported metric is NaN/inf")] = None,
    stop_patience: Annotated[Optional[str], typer.Option(
        help="METRIC:P[:max]: stop when METRIC has not improved for P reports (lower is better unless :max)")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="stream the logs until the job ends")] = False,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Run a command as N workers with the torchrun environment: deeppod submit -n 2 -- python train.py"""
    job_env = {**exported_env(), **parse_env(env)}
    low, high = parse_workers(workers)
    rules = parse_stop_rules(stop_on_nan, stop_patience)
    c = client(url, token)
    job = c.submit(command, name=name, workers=low, max_workers=high, preemptible=preemptible, stop_rules=rules,
                   max_restarts=max_restarts, gpus_per_worker=gpus_per_worker,
                   cpus_per_worker=cpus_per_worker, memory_mb_per_worker=parse_memory(memory), env=job_env,
                   workdir=str(workdir or Path.cwd()), priority=priority, grace_seconds=grace)
    console.print(f"job {job['id']} ({job['name']}) submitted: {state(job['state'])}")
    if follow:
        _stream(c, job["id"], None, True)
        final = c.wait(job["id"])
        console.print(f"job {final['id']} {state(final['state'])}: {final['reason']}")
        raise typer.Exit(0 if final["state"] == JobState.SUCCEEDED else 1)


@jobs_app.callback()
def jobs_cmd(ctx: typer.Context, state_: Annotated[Optional[str], typer.Option("--state", help="only jobs in this state")] = None,
             kind: Annotated[Optional[str], typer.Option(
                 help="only this kind: batch, serve (deployment replicas) or evaluate; comma-separated "
                      "(default: all but serve)", show_default=False)] = None,
             all_kinds: Annotated[bool, typer.Option("--all", "-a", help="every kind, replicas included")] = False,
             tenant: Annotated[Optional[str], typer.Option(help="only this tenant's (admins)")] = None,
             user: Annotated[Optional[str], typer.Option(help="only this user's")] = None,
             name: Annotated[Optional[str], typer.Option(help="only jobs whose name contains this")] = None,
             limit: int = 200, as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """List jobs, newest first (yours and your tenant's; admins see all). Deployment replicas
    are hidden unless you ask for them (--kind serve or --all). 'jobs rm' and 'jobs purge'
    remove finished jobs' folders."""
    if ctx.invoked_subcommand:
        return
    exclude = None if (kind or all_kinds) else "serve"
    rows = client(url, token).jobs(state_, limit, kind=kind, exclude_kind=exclude, tenant=tenant, user=user,
                                   name=name)
    print_json(rows) if as_json else console.print(jobs_table(rows))


@jobs_app.command("rm")
def jobs_rm(job_ids: Annotated[list[int], typer.Argument(help="finished jobs")],
            force: Annotated[bool, typer.Option("--force", help="also a stopped job (its checkpoint goes too)")] = False,
            url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Remove finished jobs' folders (logs, checkpoints, outputs); their records and events stay."""
    c = client(url, token)
    freed = sum(c.remove_job_files(i, force=force)["bytes_freed"] for i in job_ids)
    console.print(f"removed the files of {len(job_ids)} job(s): {freed / 1e6:.1f} MB freed")


@jobs_app.command("purge")
def jobs_purge(older_than: Annotated[str, typer.Option(help="jobs that ended longer ago than this: 30m, 12h, 7d")],
               url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Remove the folders of every finished job (your tenant's; admins: all) that ended before
    --older-than. Stopped jobs keep theirs, so they can still be resumed."""
    r = client(url, token).purge_jobs(parse_age(older_than))
    console.print(f"removed the files of {len(r['jobs'])} job(s): {r['bytes_freed'] / 1e6:.1f} MB freed")


def parse_age(value: str) -> float:
    """'30m', '12h', '7d', '90s' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    try:
        return float(value[:-1]) * units[value[-1]] if value[-1:] in units else float(value)
    except ValueError:
        raise InvalidRequest(f"--older-than {value!r} is not an age: use e.g. 30m, 12h or 7d") from None


@job_app.command("show")
def job_show(job_id: int, as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Everything about one job."""
    j = client(url, token).job(job_id)
    if as_json:
        print_json(j)
        return
    console.print(f"[bold]job {j['id']}[/] {j['name']}  {state(j['state'])}  tenant {j['tenant']}  user {j['user']}")
    console.print(f"command:   {' '.join(j['command'])}")
    console.print(f"workdir:   {j['workdir']}")
    console.print(f"workers:   {j['workers']} x ({j['gpus_per_worker']} GPU, {j['cpus_per_worker']:g} CPU"
                  f"{', %d MiB' % j['memory_mb_per_worker'] if j['memory_mb_per_worker'] else ''})  priority {j['priority']}")
    console.print(f"submitted: {j['submitted_at']}  started: {j['started_at'] or '-'}  ended: {j['ended_at'] or '-'}")
    if j["allocation"]:
        for w in j["allocation"]["workers"]:
            console.print(f"  rank {w['rank']}: node {w['node']} GPUs {w['gpus'] or '-'}")
    if j["exit_codes"]:
        console.print("exit codes: " + ", ".join(f"rank {r}: {c}" for r, c in j["exit_codes"].items()))
    if j["reason"]:
        console.print(f"reason:    {j['reason']}")


@job_app.command("events")
def job_events(job_id: int, as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """What happened to a job and why."""
    rows = client(url, token).events(job_id)
    print_json(rows) if as_json else console.print(rows_table(rows, ["at", "kind", "message"]))


def _stream(c, job_id: int, rank: int | None, follow: bool) -> None:
    out = sys.stdout.buffer
    for chunk in c.logs(job_id, rank=rank, follow=follow):
        out.write(chunk)
        out.flush()


@app.command()
def logs(job_id: int, follow: Annotated[bool, typer.Option("--follow", "-f", help="keep streaming until the job ends")] = False,
         rank: Annotated[Optional[int], typer.Option(help="only this worker (default: all, prefixed)")] = None,
         url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Print a job's output."""
    try:
        _stream(client(url, token), job_id, rank, follow)
    except KeyboardInterrupt:
        pass


@app.command()
def stop(job_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Stop a job gracefully: SIGTERM, it saves a checkpoint and ends as 'stopped'."""
    j = client(url, token).stop(job_id)
    msg = "stopped" if j["state"] == JobState.STOPPED else f"stopping (grace {j['grace_seconds']:g} s to checkpoint)"
    console.print(f"job {j['id']}: {msg}")


@app.command()
def resume(job_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Queue a stopped job again: same id, it continues from its last checkpoint."""
    j = client(url, token).resume(job_id)
    console.print(f"job {j['id']}: {state(j['state'])} again; it resumes from its checkpoint")


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list, width: int = 40) -> str:
    vals = [v for v in values if v is not None][-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int((v - lo) / span * (len(SPARKS) - 1) + 0.5))] for v in vals)


def metrics_table(data: dict):
    from rich.table import Table

    t = Table(box=None, header_style="bold")
    for col in ("METRIC", "STEP", "LAST", "MIN", "MAX", "POINTS", "TREND"):
        t.add_column(col, no_wrap=True)
    for name, m in sorted(data["metrics"].items()):
        vals = [v for _, v in m["series"] if v is not None]
        last = m["last"][1]
        t.add_row(name, str(m["last"][0]), "NaN/inf" if last is None else f"{last:.5g}",
                  f"{min(vals):.4g}" if vals else "-", f"{max(vals):.4g}" if vals else "-", str(m["points"]),
                  sparkline([v for _, v in m["series"]]))
    return t


@app.command()
def metrics(job_id: int, follow: Annotated[bool, typer.Option("--follow", "-f", help="refresh until the job ends")] = False,
            as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Training metrics of a job: last values and sparklines (loss, accuracy, throughput...)."""
    import time

    c = client(url, token)
    if as_json:
        print_json(c.metrics(job_id))
        return
    if not follow:
        console.print(metrics_table(c.metrics(job_id, max_points=80)))
        return
    from rich.live import Live

    with Live(metrics_table(c.metrics(job_id, max_points=80)), console=console, refresh_per_second=2) as live:
        while True:
            time.sleep(2)
            live.update(metrics_table(c.metrics(job_id, max_points=80)))
            if c.job(job_id)["state"] in FINAL_STATES:
                live.update(metrics_table(c.metrics(job_id, max_points=80)))
                break


@app.command()
def cancel(job_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Stop a job: SIGTERM to every worker, the grace period, then SIGKILL."""
    j = client(url, token).cancel(job_id)
    msg = "cancelled" if j["state"] == JobState.CANCELLED else f"stopping (grace {j['grace_seconds']:g} s)"
    console.print(f"job {j['id']}: {msg}")


@nodes_app.callback()
def nodes(ctx: typer.Context, as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Nodes and their GPUs (cordoned GPUs are listed as sick)."""
    if ctx.invoked_subcommand:
        return
    rows = client(url, token).nodes()
    if as_json:
        print_json(rows)
        return
    console.print(nodes_table(rows))


@nodes_app.command("cordon")
def nodes_cordon(name: str, gpu: Annotated[Optional[int], typer.Option(help="only this GPU")] = None,
                 url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Mark a node or GPU unhealthy: its jobs requeue elsewhere, nothing new lands there."""
    client(url, token).set_node_health(name, False, gpu)
    console.print(f"cordoned {name}" + (f" GPU {gpu}" if gpu is not None else ""))


@nodes_app.command("uncordon")
def nodes_uncordon(name: str, gpu: Annotated[Optional[int], typer.Option(help="only this GPU")] = None,
                   url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Put a node or GPU back in service."""
    client(url, token).set_node_health(name, True, gpu)
    console.print(f"uncordoned {name}" + (f" GPU {gpu}" if gpu is not None else ""))


@tenants_app.command("create")
def tenants_create(name: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    t = client(url, token).create_tenant(name)
    console.print(f"tenant {t['name']} created")


@tenants_app.command("ls")
def tenants_ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    rows = client(url, token).tenants()
    print_json(rows) if as_json else console.print(rows_table(rows, ["id", "name", "created_at"]))


@users_app.command("create")
def users_create(name: str, tenant: Annotated[str, typer.Option(help="the user's tenant")],
                 admin: Annotated[bool, typer.Option("--admin", help="an administrator (sees all tenants)")] = False,
                 url: UrlOpt = None, token: TokenOpt = None) -> None:
    u = client(url, token).create_user(name, tenant, admin)
    console.print(f"user {u['name']} created in tenant {u['tenant']}{' (admin)' if u['is_admin'] else ''}")
    console.print(f"token (shown once): {u['token']}")


@users_app.command("ls")
def users_ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    rows = client(url, token).users()
    print_json(rows) if as_json else console.print(rows_table(rows, ["id", "name", "tenant", "is_admin"]))


@tokens_app.command("current")
def tokens_current(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Print the token this CLI uses (for scripts: curl -H "Authorization: Bearer $(deeppod tokens current)")."""
    found = ClientSettings.resolve(url, token).token
    if not found:
        raise InvalidRequest("no token: log in with 'deeppod login --url URL --token TOKEN' or set DEEPPOD_TOKEN")
    sys.stdout.write(found + "\n")


@tokens_app.command("create")
def tokens_create(name: Annotated[str, typer.Option(help="a label to recognise it by")] = "",
                  user: Annotated[Optional[str], typer.Option(help="admins: for this user")] = None,
                  url: UrlOpt = None, token: TokenOpt = None) -> None:
    t = client(url, token).create_token(name, user)
    console.print(f"token {t['id']} for {t['user']} (shown once): {t['token']}")


@tokens_app.command("ls")
def tokens_ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    rows = client(url, token).tokens()
    print_json(rows) if as_json else console.print(rows_table(rows, ["id", "name", "created_at"]))


@tokens_app.command("revoke")
def tokens_revoke(token_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    client(url, token).revoke_token(token_id)
    console.print(f"token {token_id} revoked")


def load_plan_file(path: Path) -> dict:
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidRequest(f"cannot read {path}: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest(f"{path} must hold a mapping with a 'tenants' list")
    return doc


@plan_app.command("apply")
def plan_apply(path: Path, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Apply a plan from a YAML file (admins). Running jobs keep running; the next round honours it."""
    shown = client(url, token).apply_plan(load_plan_file(path))
    console.print(f"plan applied: {len(shown['plan']['tenants'])} top-level tenants")
    console.print(plan_table(shown["tenants"]))


@plan_app.command("show")
def plan_show(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Per tenant: guaranteed, max, in use, borrowed, lent, waiting demand."""
    shown = client(url, token).plan()
    if as_json:
        print_json(shown)
        return
    if shown["applied_at"]:
        console.print(f"plan applied {shown['applied_at'][:19]} by {shown['applied_by']}")
    else:
        console.print("no plan applied: every tenant shares the cluster equally (apply one with 'deeppod plan apply')")
    console.print(plan_table(shown["tenants"]))


def plan_table(rows: list[dict]):
    from rich.table import Table

    t = Table(box=None, header_style="bold")
    for col in ("TENANT", "GUARANTEED", "MAX", "WEIGHT", "IN USE", "BORROWED", "LENT", "WAITING"):
        t.add_column(col, no_wrap=True, justify="left" if col == "TENANT" else "right")
    for r in rows:
        t.add_row("  " * r["depth"] + r["name"], str(r["guaranteed"]), "-" if r["max"] is None else str(r["max"]),
                  f"{r['weight']:g}", str(r["in_use"]), str(r["borrowed"]), str(r["lent"]), str(r["waiting"]))
    return t


@app.command()
def sim(
    trace: Annotated[Path, typer.Option(help="CSV with timestamp, duration, num_gpus, cluster (the tenant)")],
    nodes: Annotated[int, typer.Option(help="simulated nodes")] = 64,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node")] = 8,
    plan: Annotated[str, typer.Option(help="plan YAML, or 'auto': each tenant guaranteed its share of the trace's GPU-time")] = "auto",
    policy: Annotated[str, typer.Option(help="deeppod, fifo or static")] = "deeppod",
    elastic_fraction: Annotated[float, typer.Option(help="share of jobs that are elastic (half to twice their size)")] = 0.0,
    out: Annotated[Path, typer.Option(help="JSON results")] = Path("sim-results.json"),
    plot: Annotated[Optional[Path], typer.Option(help="PNG of per-tenant share vs guarantee")] = None,
    limit: Annotated[Optional[int], typer.Option(help="replay only the first N jobs")] = None,
    seed: int = 0,
) -> None:
    """Replay a GPU-cluster trace through the scheduling policy on a simulated clock."""
    from deeppod.scheduler.plan import parse_plan
    from deeppod.scheduler.simulator import SimConfig, Simulator, load_trace, plot_shares, proportional_plan

    if not 0.0 <= elastic_fraction <= 1.0:
        raise InvalidRequest("--elastic-fraction must be between 0 and 1")
    if nodes < 1 or gpus_per_node < 1:
        raise InvalidRequest("--nodes and --gpus-per-node must be at least 1")
    jobs = load_trace(trace, limit)
    the_plan = proportional_plan(jobs, nodes * gpus_per_node) if plan == "auto" else \
        parse_plan(load_plan_file(Path(plan)), cluster_gpus=nodes * gpus_per_node)
    result = Simulator(jobs, the_plan, SimConfig(nodes=nodes, gpus_per_node=gpus_per_node, policy=policy,
                                                 elastic_fraction=elastic_fraction, seed=seed)).run()
    out.write_text(json.dumps(result, indent=1))
    rows = [(k, result[k]) for k in ("jobs", "completed", "utilization", "utilization_during_backlog",
                                     "backlog_hours", "jct_avg_h", "jct_p50_h", "jct_p95_h", "queue_delay_avg_h",
                                     "reclaim_latency_p95_s", "preemptions", "resizes", "restart_gpu_hours_lost",
                                     "round_ms_avg", "round_ms_p95", "round_ms_max", "wall_seconds")]
    console.print(rows_table([{"metric": k, "value": v} for k, v in rows], ["metric", "value"]))
    console.print(f"results: {out}")
    if plot:
        console.print(f"plot: {plot_shares([result], plot) or 'matplotlib is not installed; no plot'}")


train_app = typer.Typer(no_args_is_help=True, help="Built-in trainers: no code needed.")
app.add_typer(train_app, name="train")


@train_app.command("image-classifier", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train_image_classifier(
    ctx: typer.Context,
    data: Annotated[Optional[Path], typer.Option(help="class-per-folder image directory")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="a DeepPod dataset, NAME[@VERSION] (see 'deeppod data ls')")] = None,
    model: Annotated[str, typer.Option(help="torchvision model (resnet18, resnet50, ...) or small-cnn")] = "resnet18",
    epochs: int = 10,
    batch_size: Annotated[int, typer.Option(help="global batch")] = 128,
    lr: float = 0.1,
    optimizer: Annotated[str, typer.Option(help="sgd, momentum, nesterov, adam, adamw, adagrad, adadelta, rmsprop")] = "momentum",
    momentum: float = 0.9,
    weight_decay: float = 1e-4,
    image_size: Annotated[int, typer.Option(help="input size in pixels (square crops)")] = 224,
    register: Annotated[Optional[str], typer.Option(
        help="register the trained model as a new version of model NAME when training ends")] = None,
    workers: Annotated[str, typer.Option("--workers", "-n", help="N or MIN:MAX")] = "1",
    gpus_per_worker: Annotated[Optional[int], typer.Option(
        help="GPUs per worker (default: 1 when the cluster has GPUs, else 0)", show_default=False)] = None,
    name: Optional[str] = None,
    max_restarts: int = 3,
    follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Train an image classifier on your images; more options (--lr-schedule, --loader-workers,
    --finetune-from, --scale-rule, --amp, ...: 'python -m deeppod.runtime.trainers.image_classifier
    --help') pass through to the trainer and are checked before the job is submitted."""
    import sys as _sys

    if (data is None) == (dataset is None):
        raise InvalidRequest("give the images with either --dataset NAME[@VERSION] or --data FOLDER")
    if data is not None and not data.is_dir():
        raise InvalidRequest(f"--data {data} is not a folder of class folders")
    source = ["--data", str(data.resolve())] if data is not None else ["--dataset", dataset]
    args = [*source, "--model", model, "--epochs", str(epochs), "--batch-size", str(batch_size), "--lr", str(lr),
            "--optimizer", optimizer, "--momentum", str(momentum), "--weight-decay", str(weight_decay),
            "--image-size", str(image_size), *(["--register", register] if register else []), *ctx.args]
    _check_trainer_args(args, model)
    command = [_sys.executable, "-m", "deeppod.runtime.trainers.image_classifier", *args]
    c = client(url, token)  # an unknown dataset or version is refused by the server with the choices
    low, high = parse_workers(workers)
    job = c.submit(command, name=name or f"train-{model}", workers=low, max_workers=high,
                   gpus_per_worker=gpus_per_worker, max_restarts=max_restarts, workdir=str(Path.cwd()),
                   env=exported_env(), stop_rules=[{"kind": "nan", "metric": "loss"}],
                   datasets=[dataset] if dataset else None)
    console.print(f"job {job['id']} ({job['name']}) submitted: follow it with 'deeppod logs {job['id']} -f' "
                  f"and 'deeppod metrics {job['id']} -f'")
    if follow:
        _stream(c, job["id"], None, True)
        final = c.wait(job["id"])
        console.print(f"job {final['id']} {state(final['state'])}: {final['reason']}")
        raise typer.Exit(0 if final["state"] == JobState.SUCCEEDED else 1)


def _check_trainer_args(args: list[str], model: str) -> None:
    """Mistakes the trainer would make the job fail on, caught before it is submitted."""
    import contextlib
    import io

    from deeppod.runtime.trainers import image_classifier as trainer

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            trainer.parse_args(args)
    except SystemExit:
        why = said.getvalue().strip().splitlines()[-1:] or ["invalid options"]
        raise InvalidRequest(f"the trainer refuses these options: {why[0].removeprefix('image_classifier.py: ')}"
                             ) from None
    try:
        names = trainer.model_names()
    except ImportError:  # a client without torchvision: the trainer checks it on the cluster
        return
    if model not in names:
        close = [n for n in names if n.startswith(model[:4])][:8]
        raise InvalidRequest(f"--model {model!r} is not a model the trainer knows: use small-cnn or a torchvision "
                             f"classification model ({', '.join(close or names[:12])}, ...; "
                             f"{len(names)} in all)")


bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: training throughput, ...")
app.add_typer(bench_app, name="bench")


@bench_app.command("storage")
def bench_storage_cmd(
    dataset: Annotated[Optional[str], typer.Option(help="NAME[@VERSION]: staged on this host and read there")] = None,
    data: Annotated[Optional[Path], typer.Option(help="a dataset version folder instead")] = None,
    mode: Annotated[str, typer.Option(help="raw (bytes, as MLPerf Storage), loader (decode + crop) or both")] = "both",
    batch: Annotated[int, typer.Option(help="samples per accelerator step (resnet50 on H100: 400)")] = 400,
    compute: Annotated[float, typer.Option(help="seconds of compute per step (resnet50 on H100: 0.224)")] = 0.224,
    steps: int = 10,
    loader_workers: Annotated[int, typer.Option(help="loader processes per accelerator (loader mode)")] = 1,
    image_size: int = 224,
    threads: Annotated[int, typer.Option(help="threads for the raw read test")] = 4,
    out: Annotated[Optional[Path], typer.Option(help="also write the results here as JSON")] = None,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Accelerator utilisation with N emulated accelerators (largest N with AU >= 90%), and
    sequential/random read throughput of the data folder."""
    from deeppod.bench.storage import as_dicts, max_accelerators, read_throughput

    if (dataset is None) == (data is None):
        raise InvalidRequest("give --dataset NAME[@VERSION] or --data FOLDER")
    if mode not in ("raw", "loader", "both"):
        raise InvalidRequest(f"--mode {mode!r}: use raw, loader or both")
    folder = Path(client(url, token).stage(dataset)["path"]) if dataset else data
    if not (folder / "index.npy").is_file():
        raise InvalidRequest(f"{folder} is not a dataset version folder (no index.npy)")
    report = {"folder": str(folder), "batch": batch, "compute_s": compute, "steps": steps}
    io_ = read_throughput(folder, threads=threads)
    report["read"] = io_
    console.print(f"read {io_['bytes'] / 1e6:.1f} MB in {io_['files']} files with {threads} threads: sequential "
                  f"{io_['sequential_MBps']} MB/s, random {io_['random_block'] // 1024} KB reads "
                  f"{io_['random_MBps']} MB/s ({io_['random_iops']} IOPS)")
    for m in (("raw", "loader") if mode == "both" else (mode,)):
        console.print(f"{m}: emulated accelerators, batch {batch}, {compute} s compute per step")
        best, rows = max_accelerators(folder, mode=m, batch=batch, compute=compute, steps=steps,
                                      workers=loader_workers, size=image_size, echo=console.print)
        report[m] = {"max_accelerators_au90": best, "runs": as_dicts(rows)}
        console.print(f"{m}: largest N with AU >= 90%: {best}")
    if out:
        out.write_text(json.dumps(report, indent=1))


@bench_app.command("infer")
def bench_infer_cmd(
    deployment: Annotated[str, typer.Option(help="the deployment to load")],
    concurrency: Annotated[str, typer.Option(help="comma-separated numbers of concurrent clients")] = "1,8,32,64",
    duration: Annotated[float, typer.Option(help="seconds per concurrency level")] = 30.0,
    image: Annotated[Optional[Path], typer.Option(help="the image every request sends (default: a 224x224 JPEG)")] = None,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline",
                                           help="also run a plain FastAPI + torch server with the same model")] = True,
    out: Annotated[Optional[Path], typer.Option(help="also write the results here as JSON")] = None,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Closed-loop load: throughput and p50/p99 latency per concurrency, beside the baseline."""
    import io

    from deeppod.bench.infer import compare

    try:
        levels = [int(x) for x in concurrency.split(",") if x.strip()]
    except ValueError:
        raise InvalidRequest(f"--concurrency {concurrency!r}: write numbers separated by commas, e.g. 1,8,32") from None
    if not levels or min(levels) < 1 or duration <= 0:
        raise InvalidRequest("--concurrency needs numbers of at least 1 and --duration more than 0")
    c = client(url, token)
    d = c.deployment(deployment)
    if image is not None:
        body = image.read_bytes()
    else:
        from PIL import Image

        buf = io.BytesIO()
        Image.effect_noise((224, 224), 64).convert("RGB").save(buf, "JPEG", quality=90)
        body = buf.getvalue()
    model_dir = c.model_version(f"{d['model']}@{d['version']}")["path"] if baseline else None
    console.print(f"{deployment}: {d['model']}@{d['version']}, {d['replicas']} replicas, batch {d['max_batch']} / "
                  f"{d['max_wait_ms']:g} ms; {len(body)}-byte image; {duration:g} s per level")
    rows = compare(d["predict_url"], {"Authorization": f"Bearer {c.token}"}, body, "image/jpeg", model_dir=model_dir,
                   concurrencies=levels, duration=duration, echo=console.print)
    if out:
        out.write_text(json.dumps({"deployment": d["name"], "model": f"{d['model']}@{d['version']}",
                                   "replicas": d["replicas"], "max_batch": d["max_batch"],
                                   "max_wait_ms": d["max_wait_ms"], **rows}, indent=1))


@bench_app.command("train")
def bench_train_cmd(
    model: str = "resnet50",
    batch_size: Annotated[int, typer.Option(help="per worker")] = 64,
    workers: int = 1,
    image_size: int = 224,
    steps: int = 20,
    synthetic: Annotated[bool, typer.Option("--synthetic", help="synthetic images (the only kind for now)")] = True,
    forward_only: Annotated[bool, typer.Option("--forward-only", help="inference only")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Training images/s per worker and in total, and scaling efficiency from 1 to N workers
    (AMP and channels_last on GPUs)."""
    from deeppod.bench.train import bench_train

    if workers < 1 or batch_size < 1 or steps < 1:
        raise InvalidRequest("--workers, --batch-size and --steps must be at least 1")
    r = bench_train(model, batch_size, workers, image_size, steps, forward_only)
    if as_json:
        print_json(r)
        return
    n = r["n_workers"]
    console.print(f"{model} batch {batch_size}/worker, {image_size}px, {'forward only' if forward_only else 'training'}")
    console.print(f"1 worker:  {r['one_worker']['images_per_second_total']:.1f} images/s")
    console.print(f"{n['workers']} workers: {n['images_per_second_total']:.1f} images/s in total, "
                  f"{n['images_per_second_per_worker']:.1f} per worker; scaling efficiency {r['scaling_efficiency']:.0%}")
    if "checkpoint_blocking_s" in n:
        console.print(f"checkpoint: {n['checkpoint_bytes'] / 1e6:.0f} MB, {n['checkpoint_blocking_s']:.2f} s blocking, "
                      f"{n['checkpoint_background_stall_s']:.3f} s stall in the background")


def main() -> None:
    try:
        app()
    except DeepPodError as exc:
        err_console.print(f"[red]error:[/] {exc.message}", highlight=False)
        sys.exit(2 if exc.status in (400, 401, 403, 404, 409, 413, 422) else 1)


if __name__ == "__main__":
    main()

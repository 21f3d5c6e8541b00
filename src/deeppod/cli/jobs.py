"""Jobs: submit, list, show, events, logs, metrics, stop, resume, cancel, rm, purge."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from deeppod.cli.common import JsonOpt, TimeOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import console, err_console, jobs_table, print_json, rows_table, state, warm_spares
from deeppod.cli.spec import SpecOpt, inline_requirements
from deeppod.cli.values import (
    exported_env,
    parse_age,
    parse_env,
    parse_memory,
    parse_stop_rules,
    parse_time_limit,
    parse_workers,
    read_requirements,
)
from deeppod.contract import FINAL_STATES, JobState, same_reason
from deeppod.units import duration_text

app = typer.Typer()
job_app = typer.Typer(no_args_is_help=True, help="One job: show, events, spec.")
jobs_app = typer.Typer(invoke_without_command=True, help="List jobs; remove finished jobs' files (rm, purge).")
app.add_typer(job_app, name="job")
app.add_typer(jobs_app, name="jobs")


def stream_logs(c, job_id: int, rank: int | None = None, follow: bool = False) -> None:
    """Write a job's output to stdout as it comes (``follow``: until the job ends)."""
    out = sys.stdout.buffer
    for chunk in c.jobs.logs(job_id, rank=rank, follow=follow):
        out.write(chunk)
        out.flush()


def say_while_queued(c, job_id: int, poll: float = 1.0) -> None:
    """While the job waits, say why (on stderr), and again each time the reason changes, not
    its counts: a job that cannot start is not silent."""
    said = None
    while True:
        job = c.jobs.get(job_id)
        if job["state"] != JobState.QUEUED:
            return
        reason = job.get("reason") or "waiting for its turn"
        if said is None or not same_reason(reason, said):
            err_console.print(f"job {job_id} queued: {reason}", highlight=False, soft_wrap=True)
            said = reason
        time.sleep(poll)


def follow_job(c, job_id: int) -> None:
    """Say why it waits while it does, stream its logs until it ends, say how it ended, exit 0
    only if it succeeded."""
    say_while_queued(c, job_id)
    stream_logs(c, job_id, follow=True)
    final = c.jobs.wait(job_id)
    console.print(f"job {final['id']} {state(final['state'])}: {final['reason']}")
    raise typer.Exit(0 if final["state"] == JobState.SUCCEEDED else 1)


@app.command(context_settings={"allow_interspersed_args": False})
def submit(
    ctx: typer.Context,
    command: Annotated[list[str], typer.Argument(help="the command each worker runs, after '--'")],
    name: Annotated[str | None, typer.Option(help="job name (default: the script's name)")] = None,
    workers: Annotated[str, typer.Option("--workers", "-n",
                                         help="worker processes: N, or MIN:MAX for an elastic job")] = "1",
    gpus_per_worker: Annotated[int | None, typer.Option(
        help="GPUs per worker (default: 1 when the cluster has GPUs, else 0; pass 0 for a CPU-only job)",
        show_default=False)] = None,
    cpus_per_worker: Annotated[float | None, typer.Option(
        help="CPUs per worker (default: a GPU node's CPUs per GPU for each GPU, so CPUs never leave a GPU "
             "idle; 1 for a CPU-only worker)", show_default=False)] = None,
    memory: Annotated[str | None, typer.Option(help="memory per worker, e.g. 4G (enforced)")] = None,
    gpu_memory: Annotated[str | None, typer.Option(
        help="the memory each of a worker's GPUs must have, e.g. 40G: it runs only on such GPUs, and is refused "
             "now where the cluster has none", show_default=False)] = None,
    pids_per_worker: Annotated[int | None, typer.Option(
        help="processes and threads per worker (enforced; default: your plan's, else the server's 4096)",
        show_default=False)] = None,
    requirements: Annotated[Path | None, typer.Option(
        help="a requirements.txt (or a pyproject.toml's dependencies, or a conda environment.yaml's pip packages): "
             "the job runs in a Python environment built from it (once, then cached; the "
             "platform's packages, deeppod.runtime and torch, stay importable unless it pins its own)",
        show_default=False)] = None,
    python: Annotated[str | None, typer.Option(help="its environment's Python, e.g. 3.12 (one the nodes have)",
                                                  show_default=False)] = None,
    image: Annotated[str | None, typer.Option(
        help="a container image the server offers ('deeppod images ls'): the job runs in it, sandboxed as any job",
        show_default=False)] = None,
    network: Annotated[str | None, typer.Option(
        help="host: the host's network; isolated: a network of its own where only the DeepPod API is reachable; "
             "none: nothing reachable (sandboxed servers; default: the server's)", show_default=False)] = None,
    env: Annotated[list[str], typer.Option("--env", "-e", help="KEY=VALUE for every worker (repeatable)")] = [],  # noqa: B006
    dataset: Annotated[list[str], typer.Option(
        "--dataset", help="a dataset to stage before the job starts, NAME or NAME@VERSION (repeatable): each worker "
                          "finds its folder in DEEPPOD_DATA_<NAME>")] = [],  # noqa: B006
    model: Annotated[list[str], typer.Option(
        "--model", help="a registered model the job reads, NAME, NAME@VERSION or NAME@ALIAS (repeatable): each "
                        "worker finds the version's folder, read-only, in DEEPPOD_MODEL_<NAME>")] = [],  # noqa: B006
    workdir: Annotated[Path | None, typer.Option(
        help="a folder on the server to run in (default: here, in place when the server may run your jobs here, "
             "else a copy of here is sent with the job)")] = None,
    code: Annotated[Path | None, typer.Option(
        help="send this folder with the job; it runs in its own copy (for a server on another machine)")] = None,
    priority: Annotated[int, typer.Option(help="higher runs first within your tenant")] = 0,
    grace: Annotated[float | None,
                     typer.Option(help="seconds between SIGTERM and SIGKILL on a stop, cancel or preemption")] = None,
    time: TimeOpt = None,
    preemptible: Annotated[bool, typer.Option("--preemptible/--no-preemptible",
                                              help="may be preempted to give GPUs back to their owners")] = True,
    max_restarts: Annotated[int, typer.Option(help="requeue after a worker or node failure up to this many times")] = 0,
    stop_on_nan: Annotated[str | None,
                           typer.Option(help="stop gracefully when this reported metric is NaN/inf")] = None,
    stop_patience: Annotated[str | None, typer.Option(
        help="METRIC:P[:max]: stop when METRIC has not improved for P reports (lower is better unless :max)")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="stream the logs until the job ends")] = False,
    spec: SpecOpt = None, url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Run a command as N workers with the torchrun environment: deeppod submit -n 2 -- python train.py
    (or deeppod submit --spec job.yaml)"""
    job_env = {**exported_env(), **parse_env(env)}
    low, high = parse_workers(workers)
    rules = parse_stop_rules(stop_on_nan, stop_patience)
    c = client(url, token)
    job = c.jobs.submit(command, name=name, workers=low, max_workers=high, preemptible=preemptible, stop_rules=rules,
                   max_restarts=max_restarts, gpus_per_worker=gpus_per_worker,
                   cpus_per_worker=cpus_per_worker, memory_mb_per_worker=parse_memory(memory),
                   pids_per_worker=pids_per_worker, network=network, env=job_env, python=python,
                   requirements=read_requirements(requirements) if requirements else inline_requirements(ctx),
                   image=image, workdir=str(workdir.resolve()) if workdir else None, code=code, priority=priority,
                   grace_seconds=grace, gpu_memory_mb=parse_memory(gpu_memory), datasets=dataset, models=model,
                   time_limit_seconds=parse_time_limit(time))
    console.print(f"job {job['id']} ({job['name']}) submitted: {state(job['state'])}")
    warn_never_fits(job)
    if follow:
        follow_job(c, job["id"])


def warn_never_fits(job: dict) -> None:
    """The server's warning that the job, as asked, can never start (on stderr: scripts read stdout)."""
    if job.get("warning"):
        err_console.print(f"warning: job {job['id']} {job['warning']}", highlight=False, soft_wrap=True)


@jobs_app.callback()
def jobs_cmd(ctx: typer.Context, state_: Annotated[str | None, typer.Option("--state",
                                                                            help="only jobs in this state")] = None,
             kind: Annotated[str | None, typer.Option(
                 help="only this kind: batch, serve (deployment replicas), evaluate or trial (search trials); "
                                                      "comma-separated "
                      "(default: all but serve)", show_default=False)] = None,
             all_kinds: Annotated[bool, typer.Option("--all", "-a", help="every kind, replicas included")] = False,
             tenant: Annotated[str | None, typer.Option(help="only this tenant's (admins)")] = None,
             user: Annotated[str | None, typer.Option(help="only this user's")] = None,
             name: Annotated[str | None, typer.Option(help="only jobs whose name contains this")] = None,
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
            force: Annotated[bool, typer.Option("--force",
                                                help="also a stopped job (its checkpoint goes too)")] = False,
            url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Remove finished jobs' folders (logs, checkpoints, outputs); their records and events stay."""
    c = client(url, token)
    freed = sum(c.jobs.remove_files(i, force=force)["bytes_freed"] for i in job_ids)
    console.print(f"removed the files of {len(job_ids)} job(s): {freed / 1e6:.1f} MB freed")


@jobs_app.command("purge")
def jobs_purge(older_than: Annotated[str, typer.Option(help="jobs that ended longer ago than this: 30m, 12h, 7d")],
               url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Remove the folders of every finished job (your tenant's; admins: all) that ended before
    --older-than. Stopped jobs keep theirs, so they can still be resumed."""
    r = client(url, token).jobs.purge(parse_age(older_than))
    console.print(f"removed the files of {len(r['jobs'])} job(s): {r['bytes_freed'] / 1e6:.1f} MB freed")


@job_app.command("show")
def job_show(job_id: int, as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Everything about one job."""
    c = client(url, token)
    j = c.jobs.get(job_id)
    if as_json:
        print_json(j)
        return
    console.print(f"[bold]job {j['id']}[/] {j['name']}  {state(j['state'])}  tenant {j['tenant']}  user {j['user']}")
    console.print(f"command:   {' '.join(j['command'])}")
    console.print(f"workdir:   {j['workdir']}")
    gpus = f"{j['gpus_per_worker']} GPU" + (f" of {j['gpu_memory_mb']} MiB" if j.get("gpu_memory_mb") else "")
    memory = f", {j['memory_mb_per_worker']} MiB" if j["memory_mb_per_worker"] else ""
    console.print(f"workers:   {j['workers']} x ({gpus}, {j['cpus_per_worker']:g} CPU{memory})  priority "
                  f"{j['priority']}")
    console.print(f"submitted: {j['submitted_at']}  started: {j['started_at'] or '-'}  ended: {j['ended_at'] or '-'}")
    if j.get("time_limit_seconds"):
        console.print(f"time:      at most {duration_text(j['time_limit_seconds'])} a run, then stopped to checkpoint")
    if j.get("requirements") or j.get("python"):
        console.print(f"python:    its own environment {j.get('env_key') or '(built at start)'}"
                      f"{' on Python ' + j['python'] if j.get('python') else ''}: "
                      f"{', '.join((j.get('requirements') or '').splitlines()) or 'no packages'}")
    if j.get("image"):
        console.print(f"image:     {j['image']}{' (' + j['env_key'] + ')' if j.get('env_key') else ''}")
    if j.get("network", "host") != "host":
        console.print(f"network:   {j['network']}")
    if j.get("phase"):
        console.print(f"phase:     {j['phase']}")
    if j["allocation"]:
        for w in j["allocation"]["workers"]:
            console.print(f"  rank {w['rank']}: node {w['node']} GPUs {w['gpus'] or '-'}")
        if spares := warm_spares(j):
            console.print(f"  warm spares: {spares} on node {j['allocation']['workers'][0]['node']} "
                          "(parked with torch loaded; they become workers when it grows)")
    if j["gpus_per_worker"]:
        usage = c.jobs.gpus(job_id)
        if usage["mean_util_5m"] is not None:
            console.print(f"GPU utilization: {usage['mean_util_5m']:.0f}% (mean of its last 5 minutes of samples, "
                          f"{len(usage['gpus'])} GPUs)")
    if j["exit_codes"]:
        console.print("exit codes: " + ", ".join(f"rank {r}: {c}" for r, c in j["exit_codes"].items()))
    if j["reason"]:
        console.print(f"reason:    {j['reason']}")


@job_app.command("spec")
def job_spec(job_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A job as a spec file: deeppod job spec 12 > job.yaml, then deeppod submit --spec job.yaml."""
    print(client(url, token).jobs.spec(job_id)["yaml"], end="")


@job_app.command("events")
def job_events(job_id: int, as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """What happened to a job and why."""
    rows = client(url, token).jobs.events(job_id)
    if as_json:
        print_json(rows)
        return
    shown = [{**r, "at": r["at"][:19].replace("T", " ")} for r in rows]  # to the second, in UTC
    console.print(rows_table(shown, ["at", "kind", "message"]))


@app.command()
def logs(job_id: int, follow: Annotated[bool, typer.Option("--follow", "-f",
                                                           help="keep streaming until the job ends")] = False,
         rank: Annotated[int | None, typer.Option(help="only this worker (default: all, prefixed)")] = None,
         url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Print a job's output."""
    try:
        stream_logs(client(url, token), job_id, rank, follow)
    except KeyboardInterrupt:
        pass


@app.command()
def stop(job_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Stop a job gracefully: SIGTERM, it saves a checkpoint and ends as 'stopped'."""
    j = client(url, token).jobs.stop(job_id)
    msg = "stopped" if j["state"] == JobState.STOPPED else f"stopping (grace {j['grace_seconds']:g} s to checkpoint)"
    console.print(f"job {j['id']}: {msg}")


@app.command()
def resume(job_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Queue a stopped job again: same id, it continues from its last checkpoint."""
    j = client(url, token).jobs.resume(job_id)
    console.print(f"job {j['id']}: {state(j['state'])} again; it resumes from its checkpoint")


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list, width: int = 40) -> str:
    vals = [v for v in values if v is not None][-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int((v - lo) / span * (len(SPARKS) - 1) + 0.5))] for v in vals)


def metrics_table(data: dict, width: int | None = None):
    """One line per metric; the sparkline takes the width the numbers leave (8 to 40 columns)."""
    rows = []
    for name, m in sorted(data["metrics"].items()):
        last = m["last"][1]
        # the series may be thinned out: the last value counts too, and all three print alike, so
        # the minimum is never shown above the last value
        vals = [v for _, v in m["series"] if v is not None] + ([last] if last is not None else [])
        rows.append({"metric": name, "step": str(m["last"][0]), "last": "NaN/inf" if last is None else f"{last:.5g}",
                     "min": f"{min(vals):.5g}" if vals else "-", "max": f"{max(vals):.5g}" if vals else "-",
                     "points": str(m["points"]), "series": [v for _, v in m["series"]]})
    columns = ["metric", "step", "last", "min", "max", "points"]
    width = width or console.width
    used = sum(max([len(c), *(len(r[c]) for r in rows)]) + 2 for c in columns)
    room = max(8, min(40, width - used))
    for r in rows:
        r["trend"] = sparkline(r.pop("series"), width=room)
    return rows_table(rows, [*columns, "trend"], width=width)


@app.command()
def metrics(job_id: int, follow: Annotated[bool, typer.Option("--follow", "-f",
                                                              help="refresh until the job ends")] = False,
            as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Training metrics of a job: last values and sparklines (loss, accuracy, throughput...)."""
    import time

    c = client(url, token)
    if as_json:
        print_json(c.jobs.metrics(job_id))
        return
    if not follow:
        console.print(metrics_table(c.jobs.metrics(job_id, max_points=80)))
        return
    from rich.live import Live

    with Live(metrics_table(c.jobs.metrics(job_id, max_points=80)), console=console, refresh_per_second=2) as live:
        while True:
            time.sleep(2)
            live.update(metrics_table(c.jobs.metrics(job_id, max_points=80)))
            if c.jobs.get(job_id)["state"] in FINAL_STATES:
                live.update(metrics_table(c.jobs.metrics(job_id, max_points=80)))
                break


@app.command()
def cancel(job_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Stop a job: SIGTERM to every worker, the grace period, then SIGKILL."""
    j = client(url, token).jobs.cancel(job_id)
    msg = "cancelled" if j["state"] == JobState.CANCELLED else f"stopping (grace {j['grace_seconds']:g} s)"
    console.print(f"job {j['id']}: {msg}")

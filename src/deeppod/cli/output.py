"""Rendering for the CLI: tables, durations, errors."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone

from rich.console import Console
from rich.table import Table

from deeppod.contract import HOLDING_STATES, JobState

console = Console()
err_console = Console(stderr=True)

STATE_STYLE = {JobState.QUEUED: "yellow", JobState.PREEMPTED: "yellow", JobState.RESIZING: "yellow",
               JobState.RUNNING: "cyan", JobState.SUCCEEDED: "green", JobState.FAILED: "red",
               JobState.CANCELLED: "magenta", JobState.STOPPED: "blue",
               JobState.PRUNED: "yellow"}


def print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def duration(job: dict) -> str:
    start = _ts(job.get("started_at"))
    if start is None:
        return "-"
    end = _ts(job.get("ended_at")) or datetime.now(timezone.utc)
    if start.tzinfo is None:
        start = start.replace(tzinfo=timezone.utc)
    if end.tzinfo is None:
        end = end.replace(tzinfo=timezone.utc)
    secs = int((end - start).total_seconds())
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def current_workers(job: dict) -> int:
    if job["state"] in HOLDING_STATES and job.get("allocation"):
        return len(job["allocation"]["workers"])
    return job["workers"]


def warm_spares(job: dict) -> int:
    """Parked processes ready to join it on a grow (runtime/spare.py): they hold memory, no GPU."""
    if job["state"] in HOLDING_STATES and job.get("allocation"):
        return job["allocation"].get("spares") or 0
    return 0


def workers(job: dict) -> str:
    """'2', or for an elastic job 'now (min:max)', and '+N warm' while it keeps warm spares."""
    if not job.get("max_workers"):
        return str(current_workers(job))
    spares = warm_spares(job)
    return f"{current_workers(job)} ({job['workers']}:{job['max_workers']})" + (f" +{spares} warm" if spares else "")


def state(value: str) -> str:
    return f"[{STATE_STYLE.get(value, 'white')}]{value}[/]"


def jobs_table(jobs: list[dict], width: int | None = None) -> Table:
    """ID, STATE, WORKERS and GPUS are never cut; under 100 columns TENANT, USER and
    SUBMITTED make room for the reason (see them with 'deeppod job show ID')."""
    wide = (width or console.width) >= 100
    t = Table(box=None, header_style="bold")

    def col(name: str, values: list[str], cut: bool = False) -> None:
        if cut:
            t.add_column(name, no_wrap=True, overflow="ellipsis", max_width=24 if wide else 14)
        else:  # never shrunk: as wide as its widest cell
            t.add_column(name, no_wrap=True, min_width=max([len(name), *(len(v) for v in values)]))

    cells = [{
        "ID": str(j["id"]), "NAME": j["name"], "TENANT": j["tenant"], "USER": j["user"], "STATE": j["state"],
        "WORKERS": workers(j), "GPUS": str(current_workers(j) * j["gpus_per_worker"]),
        "SUBMITTED": j["submitted_at"][5:16].replace("T", " "), "DURATION": duration(j),
        "REASON": "" if j["state"] in (JobState.RUNNING, JobState.SUCCEEDED) else j["reason"]} for j in jobs]
    names = ["ID", "NAME", *(("TENANT", "USER") if wide else ()), "STATE", "WORKERS", "GPUS",
             *(("SUBMITTED",) if wide else ()), "DURATION"]
    for name in names:
        col(name, [c[name] for c in cells], cut=name in ("NAME", "TENANT", "USER"))
    t.add_column("REASON", overflow="fold", ratio=1)
    for c in cells:
        t.add_row(*(state(c[n]) if n == "STATE" else c[n] for n in names), c["REASON"])
    return t


def rows_table(rows: list[dict], columns: list[str]) -> Table:
    t = Table(box=None, header_style="bold")
    for col in columns:
        t.add_column(col.upper())
    for r in rows:
        t.add_row(*(str(r.get(c, "")) for c in columns))
    return t


def nodes_table(nodes: list[dict]) -> Table:
    """Per node: GPUs, CPUs and memory, each as used/total, and what is free."""
    t = Table(box=None, header_style="bold")
    for col in ("NODE", "HEALTH", "GPUS USED", "GPUS FREE", "CPUS USED", "MEMORY USED", "WORKERS", "ADDRESS"):
        t.add_column(col, no_wrap=True)
    for n in nodes:
        kind = " logical" if n["gpus"] and n["gpus"][0].get("logical") else ""
        sick = [str(g["index"]) for g in n["gpus"] if not g.get("healthy", True)]
        health = ("ok" if n["healthy"] else "[red]cordoned[/]") + (f" (sick GPUs: {','.join(sick)})" if sick else "")
        if not n.get("up", True):
            health = "[red]down[/]" + ("" if n["healthy"] else ", cordoned")
        t.add_row(n["name"], health, f"{n['gpus_used']}/{len(n['gpus'])}{kind}", str(n["gpus_free"]),
                  f"{n['cpus_used']:g}/{n['cpus']}", f"{_gib(n['memory_mb_used'])}/{_gib(n['memory_mb'])}",
                  str(n["workers"]), n["address"])
    return t


def _gib(mb: int) -> str:
    return f"{mb / 1024:.1f}G" if mb >= 1024 else f"{mb}M"

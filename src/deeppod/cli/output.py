"""Rendering for the CLI: tables, durations, errors."""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

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
    """How long it has run, every run added up (the server's run_seconds, as of the answer)."""
    start = _ts(job.get("started_at"))
    if start is None:
        return "-"
    if job.get("run_seconds") is not None:
        secs = int(job["run_seconds"])
    else:  # an older server: the current run only
        end = _ts(job.get("ended_at")) or datetime.now(UTC)
        start = start if start.tzinfo else start.replace(tzinfo=UTC)
        end = end if end.tzinfo else end.replace(tzinfo=UTC)
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
    width = width or console.width
    wide = WIDE or width >= 100
    t = Table(box=None, header_style="bold", pad_edge=False)
    used = 0

    def col(name: str, values: list[str], cut: bool = False) -> None:
        nonlocal used
        natural = max([len(name), *(len(v) for v in values)])
        if cut:
            top = 24 if wide else 14
            t.add_column(name, no_wrap=True, overflow="ellipsis", max_width=top)
            used += min(natural, top) + 2
        else:  # never shrunk: as wide as its widest cell
            t.add_column(name, no_wrap=True, min_width=natural)
            used += natural + 2

    cells = [{
        "ID": str(j["id"]), "NAME": j["name"], "TENANT": j["tenant"], "USER": j["user"], "STATE": j["state"],
        "WORKERS": workers(j), "GPUS": str(current_workers(j) * j["gpus_per_worker"]),
        "SUBMITTED": j["submitted_at"][5:16].replace("T", " "), "DURATION": duration(j),
        "REASON": _reason(j)} for j in jobs]
    names = ["ID", "NAME", *(("TENANT", "USER") if wide else ()), "STATE", "WORKERS", "GPUS",
             *(("SUBMITTED",) if wide else ()), "DURATION"]
    for name in names:
        col(name, [c[name] for c in cells], cut=name in ("NAME", "TENANT", "USER"))
    if WIDE:
        t.add_column("REASON", overflow="fold", ratio=1)
    else:  # one line per job: the whole reason is in 'deeppod job show ID' (or -o wide)
        t.add_column("REASON", no_wrap=True, overflow="ellipsis", max_width=max(_MIN_FREE, width - used))
    for c in cells:
        t.add_row(*(state(c[n]) if n == "STATE" else c[n] for n in names), c["REASON"])
    return t


def _reason(job: dict) -> str:
    """What the table says of a job: why it waits or ended; for a running one only what it is
    doing before its command runs (its phase: "preparing environment"), else nothing."""
    if job["state"] == JobState.RUNNING:
        return job.get("phase") or ""
    return "" if job["state"] == JobState.SUCCEEDED else job["reason"]


WIDE = False  # 'deeppod -o wide ...': every column, free text in full, whatever the terminal's width
FREE_TEXT = frozenset({"message", "reason", "packages"})  # a column that takes what room is left, cut with '…'
_MIN_FREE = 12


def _cell_len(value: str) -> int:
    return Text.from_markup(value).cell_len


def fit_columns(columns: list[str], cells: list[list[str]], width: int, keep: int = 1) -> list[int]:
    """Which columns fit in ``width`` at their natural width (header or widest cell, never cut):
    the last columns are left out first, so callers list them most important first, as kubectl
    does. The first ``keep`` always stay; a free-text column counts at its smallest width."""
    natural = [max([len(c), *(_cell_len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    need = [min(n, _MIN_FREE) if c.lower() in FREE_TEXT else n for c, n in zip(columns, natural)]
    shown = list(range(len(columns)))
    while len(shown) > keep and sum(need[i] + 2 for i in shown) - 2 > width:
        droppable = [i for i in shown[keep:] if columns[i].lower() not in FREE_TEXT]
        shown.remove(droppable[-1] if droppable else shown[-1])  # free text goes last of all
    return shown


_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]00:00|Z)?$")


def cell(value) -> str:
    """A value as a table shows it: nothing is '-' (not 'None' or blank), a time from the API
    is to the second in UTC ('2026-12-04 22:40:54', not ISO with microseconds)."""
    if value is None or value == "":
        return "-"
    text = str(value)
    return text[:19].replace("T", " ") if _ISO.match(text) else text


def rows_table(rows: list[dict], columns: list[str], *, width: int | None = None, keep: int = 1) -> Table:
    """A table that fits the terminal: no header or cell is cut or wrapped; columns that do not
    fit are left out from the end (``-o wide`` shows them) and a free-text column ends in '…'."""
    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    width = width or console.width
    shown = list(range(len(columns))) if WIDE else fit_columns(columns, cells, width, keep)
    natural = {i: max([len(columns[i]), *(_cell_len(row[i]) for row in cells)]) for i in shown}
    fixed = sum(natural[i] + 2 for i in shown if columns[i].lower() not in FREE_TEXT)
    t = Table(box=None, header_style="bold", pad_edge=False)
    for i in shown:
        free = columns[i].lower() in FREE_TEXT
        if free and WIDE:
            t.add_column(columns[i].upper(), overflow="fold")
        elif free:  # what the other columns leave, so the cell (not the line) is cut, with '…'
            t.add_column(columns[i].upper(), no_wrap=True, overflow="ellipsis",
                         max_width=max(_MIN_FREE, width - fixed))
        else:
            t.add_column(columns[i].upper(), no_wrap=True, min_width=natural[i])
    for row in cells:
        t.add_row(*(row[i] for i in shown))
    hidden = [columns[i].upper() for i in range(len(columns)) if i not in shown]
    if hidden:
        t.caption, t.caption_justify = f"hidden at this width: {', '.join(hidden)} (deeppod -o wide)", "left"
    return t


def nodes_table(nodes: list[dict]) -> Table:
    """Per node: GPUs, CPUs and memory, each as used/total, and what is free."""
    rows = []
    for n in nodes:
        kind = " logical" if n["gpus"] and n["gpus"][0].get("logical") else ""
        sick = [str(g["index"]) for g in n["gpus"] if not g.get("healthy", True)]
        health = ("ok" if n["healthy"] else "[red]cordoned[/]") + (f" (sick GPUs: {','.join(sick)})" if sick else "")
        if not n.get("up", True):  # and why, where its cluster says (Slurm's state and Reason)
            health = ("[red]down[/]" + ("" if n["healthy"] else ", cordoned")
                      + (f" ({escape(n['down_reason'])})" if n.get("down_reason") else ""))
        rows.append({"node": n["name"], "health": health, "gpus used": f"{n['gpus_used']}/{len(n['gpus'])}{kind}",
                     "gpus free": str(n["gpus_free"]), "cpus used": f"{n['cpus_used']:g}/{n['cpus']}",
                     "memory used": f"{_gib(n['memory_mb_used'])}/{_gib(n['memory_mb'])}",
                     "workers": str(n["workers"]), "address": n["address"],
                     # what --gpu-memory may ask there; "-": the GPUs do not say (logical slots)
                     "gpu memory": _gib(n["gpu_memory_mb"]) if n.get("gpu_memory_mb") else "-",
                     "burst": n.get("burst") or "-"})
    columns = ["node", "health", "gpus used", "gpus free", "cpus used", "memory used", "workers", "gpu memory",
               "address"]
    if any(n.get("burst") for n in nodes):  # a burst node's type: which nodes come and go (docs/cluster.md)
        columns.insert(2, "burst")
    return rows_table(rows, columns, keep=2)


def burst_tables(burst: dict) -> list[Table]:
    """Burst node types with their nodes up and asked for; each tenant's burst cost."""
    out = []
    if burst["types"]:
        out.append(rows_table([{
            "burst type": t["name"], "gpus": str(t["gpus"]),
            "nodes up": f"{t['nodes_up']}/{t['max_nodes']}",
            "asked": "-" if t["nodes_asked"] is None else str(t["nodes_asked"]),
            "cost/h": f"{t['cost_per_hour']:g}", "tenants": ",".join(t["tenants"]), "why": t["reason"] or "-"}
            for t in burst["types"]], ["burst type", "gpus", "nodes up", "asked", "cost/h", "tenants", "why"], keep=2))
    budgets = {b["tenant"]: b for b in burst["budgets"]}
    if burst["charges"]:
        out.append(rows_table([{
            "tenant": c["tenant"], "burst type": c["node_type"], "nodes": str(c["nodes"]),
            "node hours": f"{c['seconds'] / 3600:.3f}", "cost": f"{c['cost']:.2f}",
            "budget": f"{budgets[c['tenant']]['budget']:g}" if c["tenant"] in budgets else "-"}
            for c in burst["charges"]], ["tenant", "burst type", "nodes", "node hours", "cost", "budget"], keep=2))
    return out


def _gib(mb: int) -> str:
    return f"{mb / 1024:.1f}G" if mb >= 1024 else f"{mb}M"

"""``deeppod top``: a live view of nodes, GPUs, jobs and tenants."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from deeppod.cli.common import TokenOpt, UrlOpt, client
from deeppod.cli.output import console, nodes_table, state

app = typer.Typer()


def _bar(pct: float, width: int = 10) -> str:
    full = int(round(max(0.0, min(100.0, pct)) / 100 * width))
    return "█" * full + "·" * (width - full)


def frame(c) -> Group:
    nodes, gpus, hosts = c.nodes(), c.nodes.gpus(), c.nodes.hosts()
    jobs = [j for j in c.jobs(None, 50) if j["state"] in ("running", "preempted", "resizing", "queued")]
    plan = c.plan()
    host = Table(box=None, header_style="bold", title="hosts", title_justify="left")
    for col in ("NODE", "CPU", "MEMORY", "DISK", "NET RX", "NET TX"):
        host.add_column(col)
    for h in hosts:
        host.add_row(h["node"], f"{_bar(h['cpu_percent'])} {h['cpu_percent']:.0f}%",
                     f"{h['memory_used_mb'] / 1024:.1f}/{h['memory_total_mb'] / 1024:.1f}G",
                     f"{h['disk_used_percent']:.0f}%", f"{h['net_rx_bps'] / 1e6:.1f} MB/s",
                     f"{h['net_tx_bps'] / 1e6:.1f} MB/s")
    g = Table(box=None, header_style="bold", title="GPUs", title_justify="left")
    for col in ("NODE", "GPU", "UTIL", "MEMORY", "POWER", "TEMP", "ECC", "JOB"):
        g.add_column(col)
    for r in gpus:
        job = str(r["job_id"]) if r["job_id"] is not None else ("other tenant" if r["busy"] else "-")
        g.add_row(r["node"], str(r["gpu"]), f"{_bar(r['util'])} {r['util']:.0f}%",
                  f"{r['memory_used_mb'] / 1024:.1f}/{r['memory_total_mb'] / 1024:.1f}G", f"{r['power_w']:.0f} W",
                  f"{r['temperature_c']:.0f} C", str(r["ecc_uncorrected"]), job)
    util: dict[int, list[float]] = {}
    for r in gpus:
        if r["job_id"] is not None:
            util.setdefault(r["job_id"], []).append(r["util"])
    jt = Table(box=None, header_style="bold", title="jobs", title_justify="left")
    for col in ("ID", "NAME", "TENANT", "STATE", "GPUS", "GPU UTIL", "REASON"):
        jt.add_column(col)
    for j in jobs:
        gpu_n = sum(len(w["gpus"]) for w in (j.get("allocation") or {}).get("workers", []))
        u = util.get(j["id"])
        jt.add_row(str(j["id"]), j["name"], j["tenant"], state(j["state"]), str(gpu_n),
                   f"{sum(u) / len(u):.0f}%" if u else "-", "" if j["state"] == "running" else j["reason"][:60])
    tt = Table(box=None, header_style="bold", title="tenants", title_justify="left")
    for col in ("TENANT", "GUARANTEED", "IN USE", "BORROWED", "LENT", "WAITING"):
        tt.add_column(col)
    for t in plan.get("tenants", []):
        tt.add_row("  " * t.get("depth", 0) + t["name"], str(t["guaranteed"]), str(t["in_use"]), str(t["borrowed"]),
                   str(t["lent"]), str(t["waiting"]))
    return Group(nodes_table(nodes), host, g, jt, tt)


@app.command()
def top(once: Annotated[bool, typer.Option("--once", help="print one frame and exit")] = False,
        interval: Annotated[float, typer.Option(help="seconds between refreshes")] = 2.0,
        url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A live view of nodes, hosts, GPUs (utilization, memory, power, errors, job), jobs and tenants."""
    c = client(url, token)
    if once:
        console.print(frame(c))
        return
    try:
        with Live(frame(c), console=console, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(frame(c))
    except KeyboardInterrupt:
        pass

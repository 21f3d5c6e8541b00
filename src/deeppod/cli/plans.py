"""Resource plans (apply, show) and the trace-replay simulator (sim)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import console, print_json, rows_table
from deeppod.errors import InvalidRequest

app = typer.Typer()
plan_app = typer.Typer(no_args_is_help=True, help="Resource plans: guaranteed GPUs, borrowing caps, weights.")
app.add_typer(plan_app, name="plan")


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
    console.print(surplus_line(shown["plan"]))
    for warning in shown.get("warnings") or ():
        console.print(f"[yellow]warning:[/yellow] {warning}")


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
        console.print("no plan applied: no tenant has a guarantee (apply one with 'deeppod plan apply')")
    console.print(plan_table(shown["tenants"]))
    console.print(surplus_line(shown["plan"]))


def surplus_line(plan: dict) -> str:
    if plan.get("surplus", "service") == "share":
        return "GPUs beyond the guarantees: to the tenant using least of its weighted share (surplus: share)"
    return ("GPUs beyond the guarantees: to the waiting job with the least attained service, then the earliest "
            "(surplus: service)")


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
    plan: Annotated[str, typer.Option(
        help="plan YAML, or 'auto': each tenant guaranteed its share of the trace's GPU-time")] = "auto",
    policy: Annotated[str, typer.Option(help="deeppod, fifo or static")] = "deeppod",
    elastic_fraction: Annotated[float,
                                typer.Option(help="share of jobs that are elastic (half to twice their size)")] = 0.0,
    out: Annotated[Path, typer.Option(help="JSON results")] = Path("sim-results.json"),
    plot: Annotated[Path | None, typer.Option(help="PNG of per-tenant share vs guarantee")] = None,
    limit: Annotated[int | None, typer.Option(help="replay only the first N jobs")] = None,
    scale: Annotated[int, typer.Option(help="K copies of the trace's tenants and jobs (arrivals jittered by up to "
                                            "5 minutes) on K times --nodes: a cluster K times the size")] = 1,
    seed: int = 0,
) -> None:
    """Replay a GPU-cluster trace through the scheduling policy on a simulated clock."""
    from deeppod.scheduler.plan import parse_plan
    from deeppod.scheduler.simulator import (
        SimConfig,
        Simulator,
        load_trace,
        plot_shares,
        proportional_plan,
        scale_trace,
    )

    if not 0.0 <= elastic_fraction <= 1.0:
        raise InvalidRequest("--elastic-fraction must be between 0 and 1")
    if nodes < 1 or gpus_per_node < 1:
        raise InvalidRequest("--nodes and --gpus-per-node must be at least 1")
    jobs = scale_trace(load_trace(trace, limit), scale, seed=seed)
    nodes *= scale
    the_plan = proportional_plan(jobs, nodes * gpus_per_node) if plan == "auto" else \
        parse_plan(load_plan_file(Path(plan)), cluster_gpus=nodes * gpus_per_node)
    result = Simulator(jobs, the_plan, SimConfig(nodes=nodes, gpus_per_node=gpus_per_node, policy=policy,
                                                 elastic_fraction=elastic_fraction, seed=seed)).run()
    out.write_text(json.dumps(result, indent=1))
    rows = [(k, result[k]) for k in ("cluster", "jobs", "completed", "utilization", "utilization_during_backlog",
                                     "backlog_hours", "jct_avg_h", "jct_p50_h", "jct_p95_h", "queue_delay_avg_h",
                                     "reclaim_latency_p95_s", "preemptions", "resizes", "restart_gpu_hours_lost",
                                     "round_ms_avg", "round_ms_p50", "round_ms_p95", "round_ms_p99", "round_ms_max",
                                     "rounds",
                                     "wall_seconds")]
    console.print(rows_table([{"metric": k, "value": v} for k, v in rows], ["metric", "value"]))
    console.print(f"results: {out}")
    if plot:
        console.print(f"plot: {plot_shares([result], plot) or 'matplotlib is not installed; no plot'}")

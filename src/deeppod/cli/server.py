"""``deeppod server``: start the control plane."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deeppod.cli.output import console
from deeppod.cli.values import parse_memory

app = typer.Typer()


@app.command()
def server(
    host: Annotated[str | None, typer.Option(help="address to listen on (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default 7447)")] = None,
    s3_port: Annotated[int | None, typer.Option(
        help="serve S3 also at the root of this port, for clients that take a host, not a URL (MinIO's SDK, "
             "mc); it stays at /s3 of --port too (DEEPPOD_S3_PORT)", show_default=False)] = None,
    home: Annotated[Path | None, typer.Option(help="state folder (DEEPPOD_HOME, default ~/.deeppod)")] = None,
    gpus: Annotated[int | None, typer.Option(help="logical GPU slots instead of the real GPUs (CPU machines)")] = None,
    gpu_memory: Annotated[str | None, typer.Option(
        help="the memory each logical slot stands for, e.g. 80G: jobs' --gpu-memory is then checked against it "
             "(DEEPPOD_GPU_MEMORY_MB; default: not known, any request fits)", show_default=False)] = None,
    cpus: Annotated[int | None, typer.Option(help="CPUs this node offers to jobs (default: all)")] = None,
    memory: Annotated[str | None, typer.Option(help="memory this node offers to jobs, e.g. 16G (default: all)")] = None,
    database_url: Annotated[str | None,
                            typer.Option(help="SQLAlchemy URL (DEEPPOD_DATABASE_URL); default SQLite in home")] = None,
    hot_dir: Annotated[Path | None, typer.Option(help="fast storage for datasets in use (DEEPPOD_HOT_DIR)")] = None,
    cold_dir: Annotated[Path | None, typer.Option(help="capacity storage for idle datasets (DEEPPOD_COLD_DIR)")] = None,
    isolation: Annotated[str | None, typer.Option(
        help="sandbox: each tenant's jobs run as its own OS identity in namespaces (needs root); single-user: "
             "jobs run as the server's identity, several tenants allowed but not isolated; one-tenant: the "
             "same, and a second tenant is refused; auto (the default): sandbox as root, else one-tenant "
             "(DEEPPOD_ISOLATION)",
        show_default=False)] = None,
    work_roots: Annotated[str | None, typer.Option(
        help="with sandbox isolation, where tenants' jobs may work: paths with {tenant}, ':'-separated "
             "(DEEPPOD_WORK_ROOTS; default HOME/work/{tenant})", show_default=False)] = None,
    single_user: Annotated[bool, typer.Option(
        "--single-user", help="allow several tenants without isolating them (the same as --isolation single-user): "
                              "every start says what is not protected")] = False,
    cpu_limit: Annotated[str | None, typer.Option(
        help="share: a sandboxed worker's CPU time is shared by the weight of its CPUs under contention (the "
             "default); quota: also a hard cap at its CPUs (DEEPPOD_CPU_LIMIT)", show_default=False)] = None,
    unenforced_limits: Annotated[bool, typer.Option(
        "--unenforced-limits", help="start sandbox isolation even where the kernel's control groups cannot be "
                                    "used: jobs' memory is then polled, processes and CPU not limited "
                                    "(DEEPPOD_UNENFORCED_LIMITS)")] = False,
    executor: Annotated[str | None, typer.Option(
        help="where jobs run: local (this machine, the default), ray (a Ray cluster) or slurm (the Slurm cluster "
             "this host submits to: Slurm queues and places them); docs/cluster.md (DEEPPOD_EXECUTOR)")] = None,
    ray_address: Annotated[str | None, typer.Option(
        help="the Ray cluster's HEAD:6379, as 'ray start --head' printed it (DEEPPOD_RAY_ADDRESS)")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(
        help="logical GPU slots per Ray node that has no GPUs (DEEPPOD_GPUS_PER_NODE)")] = None,
    slurm_partition: Annotated[str | None, typer.Option(
        help="the Slurm partition jobs go to, whose nodes are DeepPod's (DEEPPOD_SLURM_PARTITION)")] = None,
    advertise_url: Annotated[str | None, typer.Option(
        help="the URL jobs, clients and the other servers reach this one at, when the listening address is not "
             "it (DEEPPOD_ADVERTISE_URL)")] = None,
    tls_cert: Annotated[Path | None,
                        typer.Option(help="serve https with this PEM certificate (DEEPPOD_TLS_CERT)")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="its private key, PEM (DEEPPOD_TLS_KEY)")] = None,
    tls_ca: Annotated[Path | None, typer.Option(
        help="the CA file clients and jobs verify the certificate with, when it is not from a public CA "
             "(DEEPPOD_TLS_CA)")] = None,
    tls_self_signed: Annotated[bool, typer.Option(
        "--tls-self-signed", help="serve https with a certificate made once in HOME/tls (a proof of concept; "
                                  "clients verify it with HOME/tls/trust/ca.pem)")] = False,
    uninstall_users: Annotated[bool, typer.Option(
        "--uninstall-users", help="remove the OS users this installation (its HOME) made for its tenants, and "
                                  "exit; run it with the server stopped, before removing HOME (needs root)")] = False,
) -> None:
    """Start the control plane: API, scheduler loop and executor. Several servers on one
    PostgreSQL database (--database-url) form a failover control plane: one leads, the others
    serve the API and take over when it stops (docs/cluster.md)."""

    from deeppod.server import configure_logging, serve
    from deeppod.settings import Settings

    settings = Settings.from_env().with_overrides(
        host=host, port=port, s3_port=s3_port, home=_abs_path(home), gpus=gpus, cpus=cpus,
        gpu_memory_mb=parse_memory(gpu_memory), memory_mb=parse_memory(memory), database_url=database_url,
        hot_dir=_abs_path(hot_dir), cold_dir=_abs_path(cold_dir), isolation="single-user" if single_user else isolation,
        work_roots=work_roots, cpu_limit=cpu_limit, unenforced_limits=True if unenforced_limits else None,
        executor=executor, ray_address=ray_address, gpus_per_node=gpus_per_node, slurm_partition=slurm_partition,
        advertise_url=advertise_url, tls_cert="self-signed" if tls_self_signed else _abs(tls_cert),
        tls_key=_abs(tls_key), tls_ca=_abs(tls_ca))
    configure_logging(settings.log_level)
    if uninstall_users:
        return _uninstall_users(settings)
    serve(settings, echo=lambda line: console.print(line, highlight=False, soft_wrap=True))


def _uninstall_users(settings) -> None:
    from deeppod.auth.identities import remove_users
    from deeppod.jobs.launch import Isolation

    prefix = Isolation(None, (), instance=settings.instance).user_prefix
    removed = remove_users(prefix)
    console.print(f"removed {len(removed)} OS user(s) of this installation ({prefix}*): {', '.join(removed)}"
                  if removed else f"no OS user of this installation ({prefix}*) to remove")


def _abs_path(path: Path | None) -> Path | None:
    return path.expanduser().resolve() if path else None


def _abs(path: Path | None) -> str | None:
    return str(path.expanduser().resolve()) if path else None

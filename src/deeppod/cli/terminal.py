"""``deeppod shell`` and ``deeppod exec``: a terminal inside a running job's sandbox, over the
API's WebSocket (api/terminal.py): keystrokes go raw (Ctrl-C reaches the job's command as the
terminal's SIGINT), the window's size follows this terminal's, and the command's exit status
is this command's."""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import termios
import threading
import tty
from typing import Annotated
from urllib.parse import urlencode

import typer

from deeppod.cli.common import TokenOpt, UrlOpt, client
from deeppod.contract import tls_context
from deeppod.errors import DeepPodError

app = typer.Typer()
RankOpt = Annotated[int, typer.Option("--rank", help="which worker (rank) of the job")]


def _size() -> tuple[int, int]:
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
        return size.lines, size.columns
    except OSError:
        return 24, 80


def _open(job_id: int, rank: int, argv: list[str], url: str | None, token: str | None):
    from websockets.exceptions import InvalidStatus  # only these two commands load it: every other starts sooner
    from websockets.sync.client import connect

    c = client(url, token)
    rows, cols = _size()
    query = urlencode([("rank", rank), ("rows", rows), ("cols", cols), *(("argv", a) for a in argv)])
    ws_url = c.url.replace("http", "ws", 1).rstrip("/") + f"/v1/jobs/{job_id}/shell?{query}"
    try:
        return connect(ws_url, additional_headers={"Authorization": f"Bearer {c.token}"}, max_size=None,
                       ssl=tls_context(c.url, c.ca_cert) if ws_url.startswith("wss") else None, open_timeout=30)
    except InvalidStatus as exc:
        try:
            said = json.loads(exc.response.body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            said = f"the server answered {exc.response.status_code}"
        raise DeepPodError(said) from None


def _run(ws) -> int:
    """Relay until the command ends; its exit status."""
    from websockets.exceptions import ConnectionClosed

    code = [255]
    done = threading.Event()
    stdin = sys.stdin.fileno()

    def outward():
        try:
            for message in ws:
                if isinstance(message, bytes):
                    os.write(sys.stdout.fileno(), message)
                elif "exit_status" in (said := json.loads(message)):
                    code[0] = int(said["exit_status"])
        except ConnectionClosed:
            pass
        finally:
            done.set()

    threading.Thread(target=outward, daemon=True).start()
    interactive = os.isatty(stdin)
    saved = termios.tcgetattr(stdin) if interactive else None
    if interactive:
        tty.setraw(stdin)
        signal.signal(signal.SIGWINCH, lambda *_: ws.send(json.dumps({"resize": list(_size())})))
    try:
        while not done.is_set():
            if not select.select([stdin], [], [], 0.1)[0]:
                continue
            data = os.read(stdin, 1 << 16)
            if not data:  # our input ended: end the command's (^D at a terminal's line start)
                ws.send(b"\x04")
                done.wait()
                break
            ws.send(data)
    except ConnectionClosed:
        pass
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        done.wait(5)
        ws.close()
    return code[0]


@app.command("shell")
def shell(job_id: int, rank: RankOpt = 0, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A shell inside a running job's sandbox (its identity, namespaces, limits, folder), like kubectl exec -it."""
    raise typer.Exit(_run(_open(job_id, rank, [], url, token)))


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(ctx: typer.Context, job_id: int, rank: RankOpt = 0, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Run one command inside a running job's sandbox: deeppod exec JOB -- nvidia-smi; its exit status is this one's."""
    if not ctx.args:
        raise typer.BadParameter("give the command after --, e.g. deeppod exec 7 -- nvidia-smi")
    raise typer.Exit(_run(_open(job_id, rank, list(ctx.args), url, token)))

"""A notebook as a user gets one (`deeppod notebook start`; sandboxed as root): from the start
request to the first kernel reply through the control plane's proxy, and a cell's round trip
(execute_request to execute_reply on the kernel's WebSocket) through the proxy against a direct
connection to the same Jupyter server's socket, interleaved cell by cell. Aim: the proxy's
round trip at most 1.2x the direct one in the worst round.

    sudo .venv/bin/python benchmarks/notebook_start.py [--rounds 3] [--cells 200]

Prints the start time, each side's median round trip per round and the ratio's spread.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from websockets.sync.client import connect

from deeppod.auth.tokens import notebook_secret
from deeppod.bench.server import Server
from deeppod.bench.spread import LoadMeter, Spread, machine
from deeppod.notebooks.upstream import connect as connect_socket
from deeppod.store import sealed


class Kernel:
    """One kernel's WebSocket: a cell at a time, timed from its request to its reply."""

    def __init__(self, ws):
        self.ws, self.session = ws, uuid.uuid4().hex

    def run(self, code: str) -> float:
        msg_id = uuid.uuid4().hex
        began = time.perf_counter()
        self.ws.send(json.dumps({"header": {"msg_id": msg_id, "username": "bench", "session": self.session,
                                            "msg_type": "execute_request", "version": "5.3"},
                                 "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                                 "content": {"code": code, "silent": False, "store_history": False,
                                             "user_expressions": {}, "allow_stdin": False}}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "execute_reply":
                return time.perf_counter() - began


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cells", type=int, default=200, help="cells per side per round")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="dpnb", dir="/tmp"))
    isolation = "sandbox" if os.geteuid() == 0 else "single-user"
    server = Server(home, env={"DEEPPOD_ISOLATION": isolation}).start()
    meter, stack = LoadMeter(), contextlib.ExitStack()
    try:
        token = (home / "admin.token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        began = time.perf_counter()
        nb = httpx.post(server.url + "/v1/notebooks", json={"gpus_per_worker": 0}, headers=auth, timeout=60).json()
        base = f"{server.url}/notebooks/{nb['id']}"
        while httpx.get(base + "/api/status", headers=auth, timeout=30).status_code != 200:
            if time.perf_counter() - began > 300:
                raise SystemExit("the notebook did not answer in 5 minutes")
            time.sleep(0.05)
        up = time.perf_counter() - began
        kernel = httpx.post(base + "/api/kernels", json={"name": "python3"}, headers=auth, timeout=60).json()["id"]
        path = f"/notebooks/{nb['id']}/api/kernels/{kernel}/channels"
        proxied = Kernel(stack.enter_context(connect(
            base.replace("http://", "ws://") + f"/api/kernels/{kernel}/channels", additional_headers=auth,
            open_timeout=60, compression=None, max_size=None)))
        proxied.run("1")
        first = time.perf_counter() - began
        sealed.configure((home / "secret.key").read_bytes().strip())  # the server's key: the notebook's token
        workdir = str(home / "jobs" / str(nb["id"]) / "code")
        direct = Kernel(stack.enter_context(connect(
            f"ws://localhost{path}", sock=connect_socket(workdir), compression=None, max_size=None,
            additional_headers={"Authorization": f"token {notebook_secret(nb['id'])}"})))
        direct.run("1")
        print(f"machine: {machine()}; isolation {isolation}")
        print(f"start to the notebook answering through the proxy: {up:.2f} s; to the first kernel reply: "
              f"{first:.2f} s")
        ratios = []
        for r in range(args.rounds):
            times = {"proxy": [], "direct": []}
            for _ in range(args.cells):  # interleaved: a burst of other work hits both sides alike
                times["proxy"].append(proxied.run("pass"))
                times["direct"].append(direct.run("pass"))
            p, d = statistics.median(times["proxy"]), statistics.median(times["direct"])
            ratios.append(p / d)
            print(f"round {r + 1}: a cell's round trip through the proxy {p * 1e3:.2f} ms, direct {d * 1e3:.2f} ms, "
                  f"ratio {p / d:.2f}")
        print(Spread.of(ratios).line("proxy / direct (a cell's round trip)", aim=1.2, higher_is_better=False),
              meter.line())
        stack.close()
        httpx.post(f"{server.url}/v1/notebooks/{nb['id']}/stop", headers=auth, timeout=30)
        server.end_jobs()
    finally:
        stack.close()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())

"""A ``deeppod server`` process for a benchmark: its own home, a free loopback port, jobs
run as the caller (single-user isolation), started and stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from deeppod.contract import free_port


class Server:
    def __init__(self, home: Path, env: dict | None = None, gpus: int = 2):
        self.home, self.port, self.gpus = home, free_port(), gpus
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")},
                    "DEEPPOD_HOME": str(home), "DEEPPOD_ISOLATION": "single-user",
                    "DEEPPOD_CONFIG": str(home / "client.json"), "DEEPPOD_LOG_LEVEL": "WARNING", **(env or {})}
        self.proc = None

    def start(self) -> Server:
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.home / f"server-{self.port}.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "deeppod.cli", "server", "--port", str(self.port),
                                      "--gpus", str(self.gpus)], env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.home / f"server-{self.port}.log").read_text())
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the server did not answer")

    def health(self) -> dict:
        return httpx.get(self.url + "/healthz", timeout=2).json()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def end_jobs(self, grace: float = 30.0) -> int:
        """End what the server's jobs left running (a deployment's replicas, say): jobs outlive
        their server by design, a benchmark's must not outlive the benchmark. Each job's
        supervisor is stopped as the executor stops it (SIGTERM, then the job's grace).
        Returns how many were still running."""
        from deeppod.executor.local import LocalExecutor

        ex, handles = LocalExecutor(), []
        for f in sorted((self.home / "jobs").glob("*/supervisor.json")):
            try:
                handles.append({"kind": "local", "job_dir": str(f.parent), **json.loads(f.read_text())})
            except (OSError, ValueError):
                continue  # it had not started, or was cleaned up
        running = [h for h in handles if not ex.poll(h).finished]
        for h in running:
            ex.terminate(h)
        deadline = time.monotonic() + grace
        while any(not ex.poll(h).finished for h in running) and time.monotonic() < deadline:
            time.sleep(0.2)
        return len(running)

    @property
    def admin_token(self) -> str:
        return (self.home / "admin.token").read_text().strip()

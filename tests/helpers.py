"""Shared test helpers: free ports, live servers, waiting."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx

from deeppod.contract import free_port

ROOT = Path(__file__).resolve().parents[1]


def wait_until(pred, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class PortTaken(Exception):
    """The free port picked for a server was taken before it listened."""


class LiveServer:
    """A real ``deeppod server`` process on a free loopback port."""

    def __init__(self, home: Path, gpus: int = 4, cpus: int = 8, port: int | None = None, extra_env=None,
                 tls: bool = False, isolation: str | None = "single-user"):
        """``isolation``: DEEPPOD_ISOLATION; None: the default a user gets (auto)."""
        self.home = home
        self.isolation = isolation
        self.gpus = gpus
        self.cpus = cpus
        self.auto_port = port is None
        self.port = port or free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.extra_env = {**({"DEEPPOD_TLS_CERT": "self-signed"} if tls else {}), **(extra_env or {})}
        self.ca_cert = home / "tls" / "trust" / "ca.pem" if tls else None
        self.proc: subprocess.Popen | None = None
        self.output = home / f"server-{self.port}.log"

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
        # several tenants, not sandboxed: tests/e2e/test_isolation.py and the sandboxed serving flow
        # start theirs with DEEPPOD_ISOLATION=sandbox
        env.update({"DEEPPOD_HOME": str(self.home), "DEEPPOD_GRACE_SECONDS": "5",
                    "DEEPPOD_RECONCILE_INTERVAL": "0.2", "DEEPPOD_CONFIG": str(self.home / "client.json")})
        if self.isolation is not None:
            env["DEEPPOD_ISOLATION"] = self.isolation
        env.update(self.extra_env)
        return env

    def start(self) -> "LiveServer":
        """Start it and wait until it answers. A port picked for it that another process took
        meanwhile (tests run in parallel) is picked again."""
        for _ in range(3):
            try:
                return self._start()
            except PortTaken:
                self.port = free_port()
                self.url = f"{self.url.split('://')[0]}://127.0.0.1:{self.port}"
                self.output = self.home / f"server-{self.port}.log"
        return self._start()

    def _start(self) -> "LiveServer":
        self.home.mkdir(parents=True, exist_ok=True)
        out = open(self.output, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deeppod.cli", "server", "--port", str(self.port), "--gpus", str(self.gpus),
             "--cpus", str(self.cpus)], env=self.env(), stdout=out, stderr=subprocess.STDOUT)
        out.close()

        def up():
            if self.proc.poll() is not None:
                said = self.output.read_text()
                if self.auto_port and f"cannot listen on 127.0.0.1:{self.port}" in said:
                    raise PortTaken(said)
                raise AssertionError(f"server exited: {said}")
            if self.ca_cert is not None and not self.ca_cert.exists():
                return False
            try:
                verify = ssl.create_default_context(cafile=str(self.ca_cert)) if self.ca_cert else True
                return httpx.get(self.url + "/healthz", timeout=1, verify=verify).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, 60, what="the server to answer")
        return self

    @property
    def admin_token(self) -> str:
        return (self.home / "admin.token").read_text().strip()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cleanup_jobs(self) -> None:
        """Stop supervisors this server's jobs left behind (only ours: found by job folder), and
        remove the OS users a sandboxing server made for its tenants (only its installation's)."""
        self._remove_tenant_users()
        for sup in (self.home / "jobs").glob("*/supervisor.json"):
            try:
                pid = json.loads(sup.read_text())["pid"]
                if not (sup.parent / "result.json").exists():
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
            try:
                for wpid in json.loads((sup.parent / "workers.json").read_text()).values():
                    os.killpg(int(wpid), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def _remove_tenant_users(self) -> None:
        import pwd

        from deeppod.settings import Settings

        prefix = f"deeppod-{Settings(home=self.home).instance}-t"
        for user in pwd.getpwall():
            if user.pw_name.startswith(prefix) and os.geteuid() == 0:
                subprocess.run(["userdel", user.pw_name], capture_output=True)


def wheel(folder, name: str, version: str, value: str):
    """A pure-Python wheel, made here (nothing is downloaded in tests)."""
    dist = name.replace("-", "_")
    files = {f"{dist}/__init__.py": f"VALUE = {value!r}\n",
             f"{dist}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: deeppod-tests\n"
                                                  "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(body.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(body.encode())}" for path, body in files.items()]
    files[f"{dist}-{version}.dist-info/RECORD"] = "\n".join(record + [f"{dist}-{version}.dist-info/RECORD,,"]) + "\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, body in files.items():
            z.writestr(p, body)
    return path

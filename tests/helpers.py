"""Shared test helpers: free ports, live servers, waiting."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
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


@contextlib.contextmanager
def uvicorn_in_thread(app):
    """The port of a uvicorn server running ``app`` in a thread of this process, its protocol and
    event loop chosen as for the DeepPod server (uvicorn's defaults), behind the server's
    outermost wrapper (transport/zerocopy.py); stopped after."""
    import uvicorn

    from deeppod.transport.zerocopy import ZeroCopySend

    server = uvicorn.Server(uvicorn.Config(ZeroCopySend(app), host="127.0.0.1", port=0, log_level="warning",
                                           access_log=False, lifespan="off", log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=30, what="uvicorn started")
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)


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

    def start(self) -> LiveServer:
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

    def _start(self) -> LiveServer:
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

        try:
            wait_until(up, 60, what="the server to answer")
        except AssertionError:  # a server that never answered must not outlive the test
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            raise
        return self

    @property
    def admin_token(self) -> str:
        return (self.home / "admin.token").read_text().strip()

    def cli(self, cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """``deeppod ARGS`` as a user runs it, in ``cwd``, signed in to this server as its admin
        (the terminal 250 columns wide); with ``check`` a failure fails the test with its output."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
        env.update({"DEEPPOD_API_URL": self.url, "DEEPPOD_TOKEN": self.admin_token,
                    "DEEPPOD_CONFIG": str(cwd / "c.json"), "COLUMNS": "250"})
        p = subprocess.run([sys.executable, "-m", "deeppod.cli", *args], env=env, capture_output=True, text=True,
                           timeout=300, cwd=cwd)
        assert not check or p.returncode == 0, p.stdout + p.stderr
        return p

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


IMAGE_PROGRAMS = ("sh", "cat", "id", "ls", "touch")


def image_archive(folder, name: str, kind: str = "oci") -> Path:
    """A small container image made here from this machine's sh, cat, id, ls and touch (with
    their libraries), as ``podman save`` (kind "oci"), ``docker save`` ("docker") or
    ``podman export`` ("flat") writes it: two layers, the second replacing /etc/image-release
    and whiting out /etc/old-file; ENV IMAGE_GREETING=hello."""
    import gzip
    import io
    import shutil
    import tarfile

    files: dict[str, str] = {}  # path in the image -> host file
    for program in IMAGE_PROGRAMS:
        found = shutil.which(program, path="/usr/bin:/bin")
        files[f"bin/{program}"] = os.path.realpath(found)
        for line in subprocess.run(["ldd", found], capture_output=True, text=True).stdout.splitlines():
            parts = line.split()
            lib = parts[2] if "=>" in parts and len(parts) > 2 and parts[2].startswith("/") else \
                parts[0] if parts and parts[0].startswith("/") else None
            if lib:
                files[lib.lstrip("/")] = os.path.realpath(lib)

    def layer(entries: dict[str, bytes | str]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as t:
            for path, body in entries.items():
                if isinstance(body, str):  # a host file
                    t.add(body, arcname=path)
                else:
                    info = tarfile.TarInfo(path)
                    info.size, info.mode = len(body), 0o644
                    t.addfile(info, io.BytesIO(body))
        return out.getvalue()

    base = layer({**files, "etc/image-release": b"base\n", "etc/old-file": b"old\n"})
    top = layer({"etc/image-release": b"v2\n", "etc/.wh.old-file": b""})
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": ["PATH=/bin", "IMAGE_GREETING=hello"], "WorkingDir": "/"}}).encode()
    blobs: dict[str, bytes] = {}
    path = Path(folder) / f"{name}.tar"
    if kind == "flat":
        path.write_bytes(layer({**files, "etc/image-release": b"v2\n"}))
        return path

    def add(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest

    with tarfile.open(path, "w") as t:
        def put(arcname: str, data: bytes) -> None:
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))

        if kind == "docker":
            put("config.json", config)
            put("l1/layer.tar", base)
            put("l2/layer.tar", top)
            put("manifest.json", json.dumps([{"Config": "config.json", "RepoTags": [f"{name}:latest"],
                                              "Layers": ["l1/layer.tar", "l2/layer.tar"]}]).encode())
            return path
        layers = [add(gzip.compress(base)), add(gzip.compress(top))]
        manifest = json.dumps({"schemaVersion": 2, "config": {"digest": f"sha256:{add(config)}", "size": len(config)},
                               "layers": [{"digest": f"sha256:{d}", "size": len(blobs[d])} for d in layers]}).encode()
        index = json.dumps({"schemaVersion": 2, "manifests": [{"digest": f"sha256:{add(manifest)}",
                                                               "size": len(manifest)}]}).encode()
        put("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        put("index.json", index)
        for digest, data in blobs.items():
            put(f"blobs/sha256/{digest}", data)
    return path


def image_model(folder: Path) -> Path:
    """A small image classifier as the registry keeps one (model.pt2 and signature.json), four
    classes of 16x16 RGB images, in ``folder``: for tests that serve a model without training one."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()
    program = torch.export.export(net, (torch.zeros(2, 3, 16, 16),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))
    torch.export.save(program, str(folder / "model.pt2"))
    (folder / "signature.json").write_text(json.dumps({
        "classes": ["a", "b", "c", "d"], "input": {"kind": "image", "shape": [3, 16, 16], "mean": [0.5] * 3,
                                                   "std": [0.25] * 3, "crop": "center"}}))
    return folder

"""A real Ray cluster on this machine for the Ray executor's tests and benchmarks: ``ray
start`` run as an administrator would, several raylets with logical GPUs."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from deeppod.contract import free_port

_MARKER = "DEEPPOD_TEST_RAY_CLUSTER"


def _autoscaler_config(address: str, types: dict[str, dict]) -> dict:
    """A Ray autoscaler config for the fake multi-node provider: the head (no jobs) and
    ``types`` (name -> resources with ``max_workers``), idle nodes let go after 6 s."""
    empty = {k: [] for k in ("head_setup_commands", "setup_commands", "worker_setup_commands",
                             "head_start_ray_commands", "worker_start_ray_commands", "initialization_commands")}
    workers = {name: {"resources": {k: v for k, v in spec.items() if k != "max_workers"}, "node_config": {},
                      "min_workers": 0, "max_workers": spec.get("max_workers", 1)} for name, spec in types.items()}
    return {
        "cluster_name": "deeppod-test", "max_workers": sum(w["max_workers"] for w in workers.values()),
        "idle_timeout_minutes": 0.1, "upscaling_speed": 1.0,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": address},
        "available_node_types": {"ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
                                 **workers},
        "head_node_type": "ray.head.default", "auth": {"ssh_user": "nobody"}, "file_mounts": {},
        "cluster_synced_files": [], "file_mounts_sync_continuously": False, **empty,
    }


class LocalRayCluster:
    """A real Ray cluster on this machine, started as an administrator would (`ray start`):
    a head without GPUs and worker raylets with one GPU each, all under one temp folder so
    that exactly our processes are stopped at the end."""

    def __init__(self, gpus_per_node: int = 1, auth: bool = True, burst_types: dict[str, dict] | None = None):
        """``auth``: Ray's token authentication, as docs/cluster.md asks an administrator to
        start it (``client_env`` is what a driver, the DeepPod server, needs to connect).
        ``burst_types``: node types Ray's autoscaler adds and removes (name -> its resources,
        ``max_workers``), with Ray's fake multi-node provider: the real autoscaler, its nodes
        local processes (docs/cluster.md, "Bursting")."""
        self.gpus_per_node = gpus_per_node
        self.temp = Path(tempfile.mkdtemp(prefix="dpray", dir="/tmp"))  # unix sockets below: keep it short
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.client_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)} if auth else {}
        # every process of this cluster inherits the marker (the autoscaler's nodes are not
        # started with our temp folder in their arguments): found, and only they stopped, by it
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **self.client_env, _MARKER: str(self.temp)}
        head = ["--head", "--port", str(self.port), "--num-cpus", "1", "--num-gpus", "0",
                "--temp-dir", str(self.temp), "--include-dashboard", "false"]
        if burst_types:
            config = self.temp / "autoscaler.json"  # JSON is YAML
            config.write_text(json.dumps(_autoscaler_config(self.address, burst_types)))
            self.env["RAY_FAKE_CLUSTER"] = "1"
            head.append(f"--autoscaling-config={config}")
        self._ray(*head)

    def _ray(self, *args: str) -> None:
        ray_cli = str(Path(sys.executable).with_name("ray"))
        p = subprocess.run([ray_cli, "start", "--node-ip-address", "127.0.0.1", *args], env=self.env,
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"ray start {' '.join(args)} failed: {p.stdout}{p.stderr}")

    def add_node(self) -> None:
        self._ray("--address", self.address, "--num-cpus", "2", "--num-gpus", str(self.gpus_per_node))

    def pids(self, marker: str | None = None) -> list[int]:
        """Our Ray processes (those of one node: ``marker`` in their arguments), by PID."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    args = _args(int(entry))
                except OSError:
                    continue
                if marker is None and str(self.temp) not in args:
                    try:
                        env = Path(f"/proc/{entry}/environ").read_bytes()
                    except OSError:
                        continue
                    if f"{_MARKER}={self.temp}".encode() in env.split(b"\0"):
                        found.append(int(entry))
                elif str(self.temp) in args and (marker is None or marker in args):
                    found.append(int(entry))
        return found

    def kill_node(self, node_id_end: str) -> None:
        """The node dies as a machine would: its raylet and everything under it, SIGKILL.
        ``node_id_end``: the end of its Ray node id (what DeepPod's node name ends with)."""
        raylets = [pid for pid in self.pids("--node_id=") if re.search(
            rf"--node_id=[0-9a-f]*{re.escape(node_id_end)}(\s|$)", _args(pid))]
        if not raylets:
            raise RuntimeError(f"no raylet of node ...{node_id_end}")
        victims = set(raylets)
        for entry in os.listdir("/proc"):  # the raylet's children: its workers, our node agent
            if entry.isdigit():
                try:
                    ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid in raylets:
                    victims.add(int(entry))
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp, ignore_errors=True)


def _args(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()

"""The kernel's limits for one sandboxed worker: a control group with a hard memory limit (the
pages of its private /tmp and /dev/shm are charged to it, swap is not an escape) and a limit
on its processes, on cgroup v2 or, where the host mounts only those, the v1 controllers.

The group is made inside the one this process is in (so a server in a container or a systemd
slice stays inside its own), the worker's first process is moved into it before it runs
anything, and the group is removed when the worker has exited. Standard library only: the
sandbox (root, outside the worker) uses it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
DEFAULT_PIDS = 4096  # a worker's processes and threads: a 16-worker DataLoader with its threads fits


class Unavailable(OSError):
    """This host's control groups cannot be used here (not mounted, not writable)."""


def _own(controller: str) -> str:
    """This process's group for ``controller`` ("" for v2's unified hierarchy), from /proc."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller == "" and names == "") or controller in names.split(","):
            return path
    raise Unavailable(f"no {controller or 'unified'} cgroup for this process")


def unified() -> bool:
    return (ROOT / "cgroup.controllers").is_file()


@dataclass
class Group:
    """One worker's group: its folder per controller (one folder on v2)."""

    memory: Path
    pids: Path
    v2: bool
    memory_mb: int | None

    def add(self, pid: int) -> None:
        for folder in {self.memory, self.pids}:
            (folder / "cgroup.procs").write_text(str(pid))

    def out_of_memory(self) -> bool:
        """Whether the kernel killed a process of the group for going over its memory limit."""
        try:
            text = (self.memory / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        except OSError:
            return False
        counts = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        if int(counts.get("oom_kill", "0")) > 0:
            return True
        # an older v1 kernel says no oom_kill: a limit reached counts (failcnt) when memory was the cause
        if not self.v2 and self.memory_mb:
            try:
                return int((self.memory / "memory.failcnt").read_text()) > 0 and \
                    int((self.memory / "memory.max_usage_in_bytes").read_text()) >= self.memory_mb << 20
            except (OSError, ValueError):
                return False
        return False

    def remove(self) -> None:
        """Once its processes are gone (the sandbox's PID namespace ended): the folders go."""
        for folder in {self.memory, self.pids}:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # a process still exiting
                    time.sleep(0.02)


def create(name: str, *, memory_mb: int | None, pids: int | None = DEFAULT_PIDS) -> Group:
    """A new group ``name`` with the limits set; Unavailable if the host's groups cannot be used."""
    try:
        if unified():
            folder = ROOT / _own("").lstrip("/") / name
            folder.mkdir()
            group = Group(folder, folder, True, memory_mb)
            if memory_mb:
                (folder / "memory.max").write_text(str(memory_mb << 20))
                _write_if_there(folder / "memory.swap.max", "0")
            if pids:
                (folder / "pids.max").write_text(str(pids))
            return group
        memory = ROOT / "memory" / _own("memory").lstrip("/") / name
        pids_dir = ROOT / "pids" / _own("pids").lstrip("/") / name
        memory.mkdir()
        try:
            pids_dir.mkdir()
        except OSError:
            memory.rmdir()
            raise
        group = Group(memory, pids_dir, False, memory_mb)
        if memory_mb:
            (memory / "memory.limit_in_bytes").write_text(str(memory_mb << 20))
            _write_if_there(memory / "memory.memsw.limit_in_bytes", str(memory_mb << 20))  # no swap beyond it
        if pids:
            (pids_dir / "pids.max").write_text(str(pids))
        return group
    except Unavailable:
        raise
    except OSError as exc:
        raise Unavailable(f"cannot make control group {name}: {exc.strerror or exc}") from exc


def _write_if_there(path: Path, value: str) -> None:
    if path.exists():
        try:
            path.write_text(value)
        except OSError:  # swap accounting off in the kernel: the memory limit still holds
            pass


def check() -> str | None:
    """None when this process can make limited groups; else why not (said at server start)."""
    try:
        g = create(f"deeppod-check-{os.getpid()}", memory_mb=64, pids=16)
    except Unavailable as exc:
        return str(exc)
    g.remove()
    return None

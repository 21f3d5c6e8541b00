"""The kernel's limits for one sandboxed worker: a control group with a hard memory limit (the
pages of its private /tmp and /dev/shm are charged to it, swap is not an escape), a limit on
its processes, a CPU weight from its CPUs (and optionally a hard CPU quota), and on v1 the
devices it may open; on cgroup v2 or, where the host mounts only those, the v1 controllers.

The group is made inside the one this process is in (so a server in a container or a systemd
slice stays inside its own), the worker's first process is moved into it before it runs
anything, and the group is removed when the worker has exited. Standard library only: the
sandbox (root, outside the worker) uses it.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from deeppod.errors import LimitsUnavailable as Unavailable

ROOT = Path("/sys/fs/cgroup")
DEFAULT_PIDS = 4096  # a worker's processes and threads: a 16-worker DataLoader with its threads fits


def _own(controller: str) -> str:
    """This process's group for ``controller`` ("" for v2's unified hierarchy), from /proc."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller == "" and names == "") or controller in names.split(","):
            return path
    raise Unavailable(f"no {controller or 'unified'} cgroup for this process")


def unified() -> bool:
    return (ROOT / "cgroup.controllers").is_file()


@dataclass(frozen=True)
class Limits:
    """What one worker is held to (the sandbox spec's "limits")."""

    memory_mb: int | None = None  # hard: the kernel's OOM killer past it (tmpfs pages counted)
    pids: int | None = DEFAULT_PIDS  # processes and threads
    cpus: float | None = None  # its share of CPU time under contention (a weight)
    cpu_quota: bool = False  # and a hard cap at ``cpus`` CPUs' worth of time, contended or not
    # ("c", major, minor) it may open (minor -1: any of that major); None: any
    devices: tuple[tuple[str, int, int], ...] | None = None

    @classmethod
    def from_spec(cls, raw: dict) -> Limits:
        return cls(memory_mb=raw.get("memory_mb"), pids=raw.get("pids"), cpus=raw.get("cpus"),
                   cpu_quota=bool(raw.get("cpu_quota")), devices=None)


PERIOD_US = 100_000  # the CPU quota's period


@dataclass
class Group:
    """One worker's group: its folder per controller (one folder on v2)."""

    folders: tuple[Path, ...]
    memory: Path
    v2: bool
    memory_mb: int | None

    def add(self, pid: int) -> None:
        for folder in self.folders:
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
        for folder in self.folders:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # a process still exiting
                    time.sleep(0.02)


_OWNER = re.compile(r"deeppod-(?:check-)?(\d+)-")  # the sandbox process that made the group


def worker_name(rank: str) -> str:
    """Unique on this host for good: a killed sandbox may leave its folder, and PIDs come round."""
    return f"deeppod-{os.getpid()}-{rank}-{secrets.token_hex(3)}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep(parent: Path) -> None:
    """Remove the groups left beside ours by sandboxes that are gone (killed before their own
    clean-up, or whose processes took longer to exit than it waited). rmdir removes only an
    empty group, so one whose processes still run stays."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        owner = _OWNER.match(entry.name)
        if owner and entry.is_dir(follow_symlinks=False) and not _alive(int(owner.group(1))):
            try:
                os.rmdir(entry.path)
            except OSError:
                pass


def create(name: str, limits: Limits) -> Group:
    """A new group ``name`` with ``limits`` set; Unavailable if the host's groups cannot be used
    for them (memory and pids always; cpu when asked; devices on v1, where it is a controller)."""
    made: list[Path] = []
    try:
        if unified():
            _sweep(ROOT / _own("").lstrip("/"))
            folder = ROOT / _own("").lstrip("/") / name
            folder.mkdir()
            made.append(folder)
            _limit_v2(folder, limits)
            return Group((folder,), folder, True, limits.memory_mb)
        wanted = ["memory",
                  "pids"] + (["cpu"] if limits.cpus else []) + (["devices"] if limits.devices is not None else [])
        folders = {}
        for controller in wanted:
            _sweep(ROOT / controller / _own(controller).lstrip("/"))
            folders[controller] = ROOT / controller / _own(controller).lstrip("/") / name
            folders[controller].mkdir()
            made.append(folders[controller])
        _limit_v1(folders, limits)
        return Group(tuple(made), folders["memory"], False, limits.memory_mb)
    except (Unavailable, OSError) as exc:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass
        if isinstance(exc, Unavailable):
            raise
        raise Unavailable(f"cannot make control group {name}: {getattr(exc, 'strerror', None) or exc}") from exc


def _limit_v2(folder: Path, limits: Limits) -> None:
    if limits.memory_mb:
        (folder / "memory.max").write_text(str(limits.memory_mb << 20))
        _write_if_there(folder / "memory.swap.max", "0")
    if limits.pids:
        (folder / "pids.max").write_text(str(limits.pids))
    if limits.cpus:  # v2 has no device controller: the sandbox's /dev holds only its devices (docs/security.md)
        (folder / "cpu.weight").write_text(str(min(10000, max(1, round(100 * limits.cpus)))))
        if limits.cpu_quota:
            (folder / "cpu.max").write_text(f"{max(1000, int(limits.cpus * PERIOD_US))} {PERIOD_US}")


def _limit_v1(folders: dict[str, Path], limits: Limits) -> None:
    if limits.memory_mb:
        (folders["memory"] / "memory.limit_in_bytes").write_text(str(limits.memory_mb << 20))
        _write_if_there(folders["memory"] / "memory.memsw.limit_in_bytes", str(limits.memory_mb << 20))  # no swap
    if limits.pids:
        (folders["pids"] / "pids.max").write_text(str(limits.pids))
    if limits.cpus:
        (folders["cpu"] / "cpu.shares").write_text(str(max(2, round(1024 * limits.cpus))))
        if limits.cpu_quota:
            (folders["cpu"] / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (folders["cpu"] / "cpu.cfs_quota_us").write_text(str(max(1000, int(limits.cpus * PERIOD_US))))
    if limits.devices is not None:
        (folders["devices"] / "devices.deny").write_text("a")
        for kind, major, minor in limits.devices:
            (folders["devices"] / "devices.allow").write_text(f"{kind} {major}:{'*' if minor < 0 else minor} rwm")


def _write_if_there(path: Path, value: str) -> None:
    if path.exists():
        try:
            path.write_text(value)
        except OSError:  # swap accounting off in the kernel: the memory limit still holds
            pass


def check() -> str | None:
    """None when this process can make limited groups; else why not (said at server start)."""
    try:
        g = create(f"deeppod-check-{os.getpid()}-{secrets.token_hex(3)}", Limits(memory_mb=64, pids=16, cpus=1.0,
                                                                                 devices=()))
    except Unavailable as exc:
        return str(exc)
    g.remove()
    return None

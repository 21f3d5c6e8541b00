"""A command inside a running worker's sandbox, as ``kubectl exec`` does in a container: in the
worker's namespaces (mount and its root, PID, IPC, network), its control groups (its memory,
process and CPU limits hold), as the identity it runs as, in its working folder, with its
environment. Run by the server (root) as ``python -m deeppod.executor.enter PID -- ARGV...``
with a terminal as its standard streams; exits with the command's status (128+N for a signal).

Standard library only: it runs before any of the server's code is needed, single-threaded, as
``setns`` into a mount namespace requires.
"""

from __future__ import annotations

import fcntl
import os
import sys
import termios

from deeppod.executor.syscalls import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    PR_SET_NO_NEW_PRIVS,
    prctl,
    setns,
)

NAMESPACES = (("ipc", CLONE_NEWIPC), ("net", CLONE_NEWNET), ("pid", CLONE_NEWPID), ("mnt", CLONE_NEWNS))
SHELL = ["/bin/sh", "-c", "if command -v bash >/dev/null; then exec bash; else exec sh; fi"]


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def worker_process(pid: int, sandboxed: bool) -> int | None:
    """The process of the job's own command behind the pid the supervisor recorded: in a
    sandbox, the runner's child is the sandbox's init (PID 1 there) and its child the command."""
    if not sandboxed:
        return pid if os.path.exists(f"/proc/{pid}") else None
    init = children(pid)
    command = children(init[0]) if init else []
    return command[0] if command else None


def _ids(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])


def _join_cgroups(pid: int) -> None:
    """Into every control group the worker is in: its limits are this command's too."""
    with open(f"/proc/{pid}/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, path in lines:
        if controllers == "":  # v2 (or v1's unified hierarchy beside the v1 controllers)
            where = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
        elif controllers.startswith("name="):
            continue
        else:
            where = f"/sys/fs/cgroup/{controllers}"
            if not os.path.isdir(where):
                where = f"/sys/fs/cgroup/{controllers.split(',')[0]}"
        procs = f"{where}{path}/cgroup.procs"
        if os.path.exists(procs):
            with open(procs, "w") as f:
                f.write(str(os.getpid()))


def enter(pid: int, argv: list[str]) -> int:
    uid, gid = _ids(pid)
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    env.setdefault(b"TERM", os.environb.get(b"TERM", b"xterm-256color"))
    cwd = os.open(f"/proc/{pid}/cwd", os.O_RDONLY | os.O_DIRECTORY)  # its working folder, whatever its root
    root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY)
    fds = [(os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY), kind) for name, kind in NAMESPACES
           if os.stat(f"/proc/{pid}/ns/{name}").st_ino != os.stat(f"/proc/self/ns/{name}").st_ino]
    _join_cgroups(pid)
    for fd, kind in fds:
        setns(fd, kind)
        os.close(fd)
    os.fchdir(root)
    os.chroot(".")
    os.close(root)
    child = os.fork()  # the PID namespace is its children's: the command is born in it
    if child == 0:
        try:
            os.setsid()
            if os.isatty(0):
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)  # as the worker runs: from root to its identity, every capability gone
            prctl(PR_SET_NO_NEW_PRIVS, 1)
            os.fchdir(cwd)
            os.execvpe(argv[0], argv, {k.decode(): v.decode(errors="replace") for k, v in env.items()})
        except OSError as exc:
            sys.stderr.write(f"deeppod: cannot run {argv[0]!r} in the job: {exc.strerror}\r\n")
        os._exit(127)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 1 or not args[0].isdigit():
        sys.stderr.write("usage: python -m deeppod.executor.enter PID [-- ARGV...]\n")
        return 2
    argv = args[2:] if len(args) > 2 and args[1] == "--" else SHELL
    try:
        return enter(int(args[0]), argv)
    except OSError as exc:
        sys.stderr.write(f"deeppod: cannot enter the job's worker: {exc}\r\n")
        return 126


if __name__ == "__main__":
    sys.exit(main())

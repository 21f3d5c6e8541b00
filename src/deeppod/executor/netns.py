"""A job's own network (``--network isolated`` or ``none``): a network namespace holding only
a loopback, shared by the job's sandboxes on this node, so that nothing else on the host can
reach what the job listens on (its rendezvous store, its gloo and NCCL sockets, its abstract
unix sockets) and the job can reach nothing of the host's: not other tenants' jobs and
replicas, not local services on 127.0.0.1.

``isolated`` leaves one way out: the control plane's API. A small proxy (root, started by the
supervisor, standard library only) listens on the namespace's 127.0.0.1 at one port per API
server and forwards each connection, as opaque bytes (TLS passes through), to that server; the
job is given those loopback URLs. Its connections out are made in the host's namespace (the
proxy's dialling thread enters it for the moment it makes the socket), to the fixed addresses
it was started with and nowhere else. ``none``: no proxy, no way out.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import struct
import sys
import threading
from dataclasses import dataclass

from deeppod.executor.syscalls import CLONE_NEWNET, PR_SET_PDEATHSIG, prctl, setns, unshare

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


@dataclass(frozen=True)
class Forward:
    """The job connects to 127.0.0.1:``local`` in its namespace; the proxy to ``host``:``port``."""

    local: int
    host: str
    port: int


class _Proxy:
    """In the job's namespace: listeners, and a dial that makes its socket in the host's."""

    def __init__(self, host_ns: int, forwards: list[Forward]):
        self.host_ns = host_ns
        self.own_ns = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        self.dial_lock = threading.Lock()
        self.listeners = []
        for f in forwards:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", f.local))
            s.listen(256)
            self.listeners.append((s, f))

    def dial(self, f: Forward) -> socket.socket:
        with self.dial_lock:  # this thread alone, for the moment the name is resolved and the socket made
            setns(self.host_ns)
            try:
                family, kind, proto, _, address = socket.getaddrinfo(f.host, f.port, type=socket.SOCK_STREAM)[0]
                out = socket.socket(family, kind, proto)
            finally:
                setns(self.own_ns)
        try:
            out.connect(address)
        except OSError:
            out.close()
            raise
        return out

    def serve(self) -> None:
        for s, f in self.listeners:
            threading.Thread(target=self._accept, args=(s, f), daemon=True).start()
        threading.Event().wait()

    def _accept(self, listener: socket.socket, f: Forward) -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=self._connect, args=(conn, f), daemon=True).start()

    def _connect(self, conn: socket.socket, f: Forward) -> None:
        try:
            out = self.dial(f)
        except OSError:
            conn.close()  # the server is down: the job's client sees its connection end, and retries
            return
        threading.Thread(target=_pump, args=(out, conn), daemon=True).start()
        _pump(conn, out)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _child(forwards: list[Forward], ready: int) -> None:
    """The namespace's holder (and, with forwards, its proxy): never returns."""
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        host_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
        unshare(CLONE_NEWNET)
        _loopback_up()
        proxy = _Proxy(host_ns, forwards)
    except OSError as exc:
        os.write(ready, f"error {exc}".encode())
        os._exit(1)
    os.write(ready, b"ok")
    os.close(ready)
    try:
        proxy.serve()
    finally:
        os._exit(0)


class JobNetwork:
    """The job's namespace on this node, held by its proxy process; ``fd`` refers to it (a
    sandbox joins it with ``setns``), and keeps it while the supervisor holds it."""

    def __init__(self, pid: int, fd: int):
        self.pid, self.fd = pid, fd

    @classmethod
    def start(cls, forwards: list[Forward]) -> JobNetwork:
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(forwards, w)
        os.close(w)
        said = os.read(r, 4096).decode()
        os.close(r)
        if said != "ok":
            os.waitpid(pid, 0)
            raise OSError(f"cannot make the job's network: {said.removeprefix('error ')}")
        return cls(pid, os.open(f"/proc/{pid}/ns/net", os.O_RDONLY))

    def stop(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)

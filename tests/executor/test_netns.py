"""A job's own network namespace (executor/netns.py), for real (root): the API alone is
forwarded; nothing else on the host is reachable from inside, nor anything inside from the host."""

import os
import socket
import threading

import pytest

from deeppod.executor import sandbox
from deeppod.executor.netns import Forward, JobNetwork, setns

pytestmark = [pytest.mark.skipif(sandbox.supported() is not None, reason=str(sandbox.supported())),
              pytest.mark.slow]  # its tests start processes (tests/conftest.py)


def _listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def _echo(server: socket.socket, prefix: bytes) -> None:
    def serve():
        while True:
            try:
                c, _ = server.accept()
            except OSError:
                return
            with c:
                c.sendall(prefix + c.recv(100))
    threading.Thread(target=serve, daemon=True).start()


def _inside(net: JobNetwork, code) -> str:
    """Run ``code()`` in a child that joined the job's network; what it returns (a short string)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            setns(net.fd)
            out = code()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out = f"raised {type(exc).__name__}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    said = os.read(r, 1000).decode()
    os.close(r)
    return said


def _call(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"hi")
            return c.recv(100).decode()
    except OSError as exc:
        return f"refused {exc.errno}"


def test_only_the_forwarded_api_is_reachable_from_the_jobs_network():
    api, api_port = _listener()
    victim, victim_port = _listener()  # another tenant's rendezvous store, a replica, a local service
    _echo(api, b"api:")
    _echo(victim, b"victim:")
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0deeppod-test-abstract-{os.getpid()}")  # no permissions: only a namespace keeps it apart
    abstract.listen()
    net = JobNetwork.start([Forward(17447, "127.0.0.1", api_port)])
    try:
        assert _inside(net, lambda: _call(17447)) == "api:hi"
        assert _inside(net, lambda: _call(victim_port)).startswith("refused")
        assert _inside(net, lambda: _call(api_port)).startswith("refused")  # only through the proxy's port

        def unix():
            with socket.socket(socket.AF_UNIX) as u:
                u.connect(f"\0deeppod-test-abstract-{os.getpid()}")
                return "reached"
        assert _inside(net, unix).startswith("raised")

        def listen_inside():  # what the job listens on (its TCPStore) is not on the host's loopback
            s, port = _listener()
            return str(port)
        port = int(_inside(net, listen_inside))
        assert _call(port).startswith("refused")
    finally:
        net.stop()
        for s in (api, victim, abstract):
            s.close()


def test_none_reaches_nothing_and_an_api_that_is_down_ends_the_connection():
    net = JobNetwork.start([])
    try:
        assert _inside(net, lambda: _call(7447)).startswith("refused")
    finally:
        net.stop()
    gone = socket.socket()
    gone.bind(("127.0.0.1", 0))  # bound, not listening: the API server is down
    dead = JobNetwork.start([Forward(17448, "127.0.0.1", gone.getsockname()[1])])
    try:
        assert _inside(dead, lambda: _call(17448)) in ("", "refused 104")  # ended at once: the client retries
    finally:
        dead.stop()
        gone.close()

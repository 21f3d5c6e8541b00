"""runtime.init()'s rendezvous helper: a worker that comes before rank 0's store listens
connects within milliseconds of it listening, not after torch's reconnect back-off."""

import socket
import threading
import time

from deeppod.contract import free_port
from deeppod.runtime.context import wait_for_store


def test_wait_for_store_returns_as_soon_as_the_store_listens():
    port = free_port()
    opened = []

    def listen_later():
        time.sleep(0.3)
        opened.append(time.monotonic())  # before it listens: a connect may come back before the next line runs
        srv = socket.create_server(("127.0.0.1", port))
        srv.accept()[0].close()
        srv.close()

    t = threading.Thread(target=listen_later)
    t.start()
    wait_for_store("127.0.0.1", port, 10)
    done = time.monotonic()
    t.join(5)
    # it polls: it does not wait out its 10 s (the poll's pace: a benchmark's)
    assert opened and 0 <= done - opened[0] < 2.0


def test_wait_for_store_gives_up_at_its_timeout():
    began = time.monotonic()
    wait_for_store("127.0.0.1", free_port(), 0.2)  # nobody listens: init_process_group then reports it
    assert 0.2 <= time.monotonic() - began < 10  # not before its timeout, and it does not hang


def test_a_connect_that_meets_itself_is_not_a_store(monkeypatch):
    """Polling a loopback port nobody listens on, the kernel in time picks that port as the
    connect's own source port and the socket connects to itself (TCP simultaneous open)."""
    from deeppod.runtime import context

    port = free_port()
    made = []

    def self_connected(address, timeout=None):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.connect(address)  # Linux: connected to itself
        made.append(sock.getsockname() == sock.getpeername())
        return sock

    monkeypatch.setattr(context.socket, "create_connection", self_connected)
    began = time.monotonic()
    wait_for_store("127.0.0.1", port, 0.2)
    assert made and all(made)
    assert time.monotonic() - began >= 0.2  # it waited for a real store, to its timeout

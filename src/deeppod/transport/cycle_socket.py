"""The socket under uvicorn's request cycle, as the zero-copy send (transport/zerocopy.py) and the
direct body read (transport/direct_body.py) use it from worker threads: a descriptor of their own,
how long a thread holds on before it hands back to the event loop, the wait on the loop, and
hanging up on a client that went or got a short body."""

from __future__ import annotations

import asyncio
import os

HOLD_S = 0.05  # a worker thread waits this long for the socket (room or bytes) before it hands back


def dup(cycle) -> int:
    """A descriptor of the cycle's socket that stays this socket if the loop closes its own."""
    return os.dup(cycle.transport.get_extra_info("socket").fileno())


async def ready(fd: int, *, write: bool) -> None:
    """Until ``fd`` can be written (``write``) or read, waited for on the event loop: no thread held."""
    loop = asyncio.get_running_loop()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)
    done = loop.create_future()
    add(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        remove(fd)


def hang_up(cycle) -> None:
    """The connection closed, the cycle told so (uvicorn then sends and logs nothing more)."""
    cycle.disconnected = True
    cycle.transport.close()

"""A terminal over a WebSocket: a command under a pseudo-terminal of the server's, its output
sent as binary messages, the client's keystrokes written to it (Ctrl-C is the terminal's to
turn into SIGINT), ``{"resize": [rows, cols]}`` text messages setting its size, and at the end
one text message ``{"exit_status": CODE}`` before the socket closes. ``deeppod shell`` and ``deeppod
exec`` are its clients."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import struct
import subprocess
import termios

from fastapi import WebSocket
from fastapi.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

CHUNK = 1 << 16


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", max(1, min(rows, 1000)), max(1, min(cols, 1000)), 0, 0))


def _ended(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # it ignored the hangup
        proc.kill()
        return proc.wait()


async def relay(websocket: WebSocket, argv: list[str], rows: int, cols: int) -> None:
    """Run ``argv`` under a new terminal and relay it over the (accepted) ``websocket``."""
    master, slave = os.openpty()
    set_size(master, rows, cols)
    try:
        proc = await run_in_threadpool(subprocess.Popen, argv, stdin=slave, stdout=slave, stderr=slave,
                                       start_new_session=True, close_fds=True)
    finally:
        os.close(slave)
    loop = asyncio.get_running_loop()
    out: asyncio.Queue[bytes | None] = asyncio.Queue()

    def readable() -> None:
        try:
            data = os.read(master, CHUNK)
        except OSError:  # EIO: every process holding the terminal has ended
            data = b""
        if not data:
            loop.remove_reader(master)
        out.put_nowait(data or None)

    loop.add_reader(master, readable)

    async def outward() -> None:
        while (data := await out.get()) is not None:
            await websocket.send_bytes(data)

    async def inward() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes"):
                await run_in_threadpool(os.write, master, message["bytes"])
            elif message.get("text"):
                try:
                    rows_cols = json.loads(message["text"]).get("resize")
                    set_size(master, int(rows_cols[0]), int(rows_cols[1]))  # the kernel sends SIGWINCH
                except (ValueError, TypeError, IndexError, AttributeError, OSError):
                    pass

    reading, writing = asyncio.create_task(outward()), asyncio.create_task(inward())
    try:
        await asyncio.wait([reading, writing], return_when=asyncio.FIRST_COMPLETED)
    finally:
        writing.cancel()
        if not reading.done():  # the client left first: the command gets the terminal's hangup
            loop.remove_reader(master)
            reading.cancel()
        os.close(master)  # a command still running gets the terminal's hangup
        code = await run_in_threadpool(_ended, proc)
        try:
            await websocket.send_text(json.dumps({"exit_status": code if code >= 0 else 128 - code}))
            await websocket.close()
        except (WebSocketDisconnect, RuntimeError):
            pass

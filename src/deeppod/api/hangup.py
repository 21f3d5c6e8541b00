"""Work for a client that hung up is given up: ``in_thread_until_gone`` runs a function in the
thread pool with a ``gone()`` it may ask between steps, true once the client has disconnected
(read from the ASGI connection every POLL_S seconds while the function runs)."""

from __future__ import annotations

import asyncio
import threading

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

POLL_S = 0.5


async def in_thread_until_gone(request: Request, fn, *args):
    """``fn(*args, gone)`` in the thread pool; ``gone()`` turns true when the client has left."""
    left, done = threading.Event(), asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            if await request.is_disconnected():
                left.set()
                return
            try:
                await asyncio.wait_for(done.wait(), POLL_S)
            except TimeoutError:
                pass

    watcher = asyncio.create_task(watch())
    try:
        return await run_in_threadpool(fn, *args, left.is_set)
    finally:
        done.set()
        watcher.cancel()

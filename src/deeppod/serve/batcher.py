"""Dynamic batching: concurrent requests share one forward pass.

Items queue up; one worker thread takes what is waiting, up to ``max_batch``, waiting at
most ``max_wait`` after the oldest item arrived for more to join, and runs them as one
batch. When the worker is busy the queue fills, so under load batches form with no added
wait. With ``coming`` (how many accepted requests have not submitted their items yet: the
replica counts those still being read or decoded) the worker waits only while some are on
their way, so a lone request runs at once instead of waiting ``max_wait`` for company that
is not coming. A failing batch fails only its own items, and the worker keeps going.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

log = logging.getLogger(__name__)


class Batcher:
    def __init__(self, run: Callable[[list[Any]], Sequence[Any]], *, max_batch: int = 32, max_wait: float = 0.005,
                 on_batch: Callable[[int, float], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 thread: bool = True, coming: Callable[[], int] | None = None):
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.run, self.max_batch, self.max_wait = run, max_batch, max(0.0, max_wait)
        self.on_batch = on_batch  # (batch size, seconds) after each batch: metrics
        self.coming = coming
        self.clock = clock
        self._q: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = None
        if thread:  # else the caller runs serve_forever() itself (the main thread: see replica.py)
            self._thread = threading.Thread(target=self._loop, name="batcher", daemon=True)
            self._thread.start()

    @property
    def depth(self) -> int:
        return self._q.qsize()

    def submit(self, items: list[Any]) -> list[Future]:
        """One future per item, resolved with that item's output (thread-safe)."""
        now = self.clock()
        futures = []
        for item in items:
            f: Future = Future()
            self._q.put((now, item, f))
            futures.append(f)
        return futures

    async def __call__(self, items: list[Any]) -> list[Any]:
        """Await the outputs of ``items`` (from an event loop)."""
        return [await asyncio.wrap_future(f) for f in self.submit(items)]

    def serve_forever(self) -> None:
        """Run batches in the calling thread until close()."""
        self._loop()

    def close(self) -> None:
        self._stop.set()
        self._q.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _take(self) -> list[tuple[float, Any, Future]] | None:
        first = self._q.get()
        if first is None:
            return None
        batch = [first]
        deadline = first[0] + self.max_wait
        while len(batch) < self.max_batch:
            try:
                nxt = self._q.get_nowait()  # what is already waiting joins without delay
            except queue.Empty:
                nxt = self._wait_for_more(deadline)
                if nxt is False:
                    break
            if nxt is None:
                self._q.put(None)
                break
            batch.append(nxt)
        return batch

    _POLL = 0.0005  # how often a wait looks again whether anything is still on its way

    def _wait_for_more(self, deadline: float):
        """The next item before ``deadline``, or False: the deadline passed, or (with
        ``coming``) no accepted request has items left to submit."""
        while True:
            left = deadline - self.clock()
            if left <= 0 or (self.coming is not None and self.coming() <= 0 and self._q.empty()):
                return False
            try:
                return self._q.get(timeout=left if self.coming is None else min(left, self._POLL))
            except queue.Empty:
                continue

    def _loop(self) -> None:
        while not self._stop.is_set():
            batch = self._take()
            if batch is None:
                return
            live = [b for b in batch if b[2].set_running_or_notify_cancel()]
            if not live:
                continue
            began = time.perf_counter()
            try:
                outputs = self.run([b[1] for b in live])
                if len(outputs) != len(live):
                    raise RuntimeError(f"the batch function returned {len(outputs)} outputs for {len(live)} items")
            except Exception as exc:  # one bad batch must not stop the service
                log.exception("batch of %d failed", len(live))
                for _, _, f in live:
                    f.set_exception(exc)
                continue
            for (_, _, f), out in zip(live, outputs):
                f.set_result(out)
            if self.on_batch is not None:
                self.on_batch(len(live), time.perf_counter() - began)

"""The control plane's loops: call a tick every few seconds until the server stops, with a
tick that fails or is refused (this server lost the lead) logged and the next one retried.
Shared by the leader's loops (jobs, tune, deployments, monitor) and the server's own
(node inventory, housekeeping)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from deeppod.errors import NotLeader

log = logging.getLogger(__name__)

IDLE = "idle"  # what a loop's tick returns when it found nothing to act on
IDLE_TICK_S = 5.0  # an idle loop's next tick, unless woken first (a standby's submit waits this long)


def run_ticks(tick: Callable[[], object], stop: threading.Event, interval: float, what: str, *,
               wake: threading.Event | None = None, hurry: threading.Event | None = None,
               idle_interval: float = IDLE_TICK_S) -> None:
    """Call ``tick`` every ``interval`` seconds until ``stop``. A tick refused because this
    server lost the lead, or one that fails, is logged; the loop outlives it and the next
    tick retries. ``what`` names the loop in the log.

    With ``wake``: a tick that returns ``IDLE`` (it found nothing to act on) is followed by
    one ``idle_interval`` later, or as soon as ``wake`` is set (a commit in this process added
    what the loop acts on, store.db.on_commit_of), so an idle server idles. With ``hurry``:
    a busy loop's next tick comes as soon as ``hurry`` is set (something waits on it, such
    as the new workers of a grow that are ready), not at the end of ``interval``."""
    while not stop.is_set():
        began = time.monotonic()
        idle = False
        try:
            idle = tick() is IDLE
        except NotLeader as exc:  # the leadership thread ends this loop; nothing was decided
            log.warning("%s tick refused: %s", what, exc)
        except Exception:  # one bad tick must not end the loop
            log.exception("%s tick failed", what)
        if idle and wake is not None:
            _sleep_until_woken(wake, stop, began + idle_interval)
            continue
        if hurry is not None:
            _sleep_until_woken(hurry, stop, began + interval)
        else:
            stop.wait(max(0.0, interval - (time.monotonic() - began)))


def _sleep_until_woken(wake: threading.Event, stop: threading.Event, until: float) -> None:
    while not stop.is_set() and (left := until - time.monotonic()) > 0:
        if wake.wait(min(left, 0.5)):  # short waits: ``stop`` is seen within half a second
            break
    wake.clear()

"""The sampling loop: read every node (this machine, or each Ray node's sampler), record
(attributed, checked), and now and then roll up and drop old samples. Runs on the leader."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from deeppod.cluster.readings import NodeSource
from deeppod.executor.usage import Usage
from deeppod.loops import run_ticks
from deeppod.monitor import service

log = logging.getLogger(__name__)
COMPACT_EVERY_S = 60.0


class Monitor:
    def __init__(self, sessions: sessionmaker[Session], source: NodeSource,
                 policy: service.Policy = service.Policy(), clock: Callable[[], float] = time.time,
                 fence: Callable[[Session], None] = lambda s: None,
                 usage: Callable[[dict], Usage | None] | None = None):
        self.sessions, self.source, self.usage = sessions, source, usage
        self.policy, self.clock, self.fence = policy, clock, fence
        self.samples = 0
        self._compacted = 0.0

    def tick(self) -> list[str]:
        readings = self.source.read()
        used = self._job_usage()
        now = self.clock()
        notes = []
        with self.sessions.begin() as s:
            self.fence(s)
            held = service.holders(s)
            for node, r in readings.items():
                notes += service.record(s, node, r.gpus, r.host, now, self.policy, held)
            service.record_jobs(s, used, now)
        self.samples += 1
        if now - self._compacted >= COMPACT_EVERY_S:
            with self.sessions.begin() as s:
                service.compact(s, now, self.policy)
            self._compacted = now
        for n in notes:
            log.info("%s", n)
        return notes

    def _job_usage(self) -> dict[int, Usage]:
        """Each launched job's processes (its page's CPU and memory charts), read with no
        transaction held: walking /proc for every job must not keep the database's writers waiting."""
        if self.usage is None:
            return {}
        with self.sessions() as s:
            handles = service.holding_handles(s)
        return {job_id: u for job_id, handle in handles.items() if (u := self.usage(handle)) is not None}

    def run(self, stop: threading.Event, period: float = 5.0) -> None:
        run_ticks(self.tick, stop, period, "monitor")

"""Side-by-side figures that survive a noisy machine (issue 45).

Each benchmark runs its systems interleaved, once each per round, so a burst of someone
else's work hits every system alike, and reports the ratio's median with its min-max over
rounds. A claim is met when the *worst* round meets it. Beside the figures it prints the
machine and the load: the CPU that processes outside the benchmark's own process tree used
while it ran, in cores (0.00 on a quiet machine).

    from deeppod.bench.spread import LoadMeter, Spread, machine

    meter = LoadMeter()
    ratios = []
    for rnd in range(rounds):
        a, b = run_ours(), run_theirs()     # interleaved: each once per round
        ratios.append(a / b)
    s = Spread.of(ratios)
    print(s.line("DeepPod / DALI", aim=1.3), meter.line())
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Spread:
    """A ratio over rounds: its median, worst (lo) and best (hi) rounds."""

    median: float
    lo: float
    hi: float
    rounds: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        if not values:
            raise ValueError("no rounds to summarise")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def met(self, aim: float, higher_is_better: bool = True) -> bool:
        """Met only if the worst round meets the aim."""
        return self.lo >= aim if higher_is_better else self.hi <= aim

    def __str__(self) -> str:
        return f"{self.median:.2f}x (rounds {self.lo:.2f}-{self.hi:.2f}, n={self.rounds})"

    def line(self, what: str, aim: float | None = None, higher_is_better: bool = True) -> str:
        out = f"{what}: {self}"
        if aim is not None:
            out += f"; aim {'>=' if higher_is_better else '<='} {aim:g}x in the worst round: " + \
                ("met" if self.met(aim, higher_is_better) else "NOT met")
        return out

    def as_dict(self) -> dict:
        return {"median": round(self.median, 3), "min": round(self.lo, 3), "max": round(self.hi, 3),
                "rounds": self.rounds}


def _proc_ticks() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks used) for every process now."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry.name}/stat").read_bytes()
        except OSError:  # gone since the listing
            continue
        fields = raw[raw.rfind(b")") + 2:].split()  # after the command, which may hold spaces
        out[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return out


def _ours(procs: dict[int, tuple[int, int]]) -> set[int]:
    """This process and its descendants (servers, workers, replicas the benchmark started)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    seen, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        seen.add(pid)
        todo += children.get(pid, [])
    return seen


class LoadMeter:
    """The CPU of processes that are not this benchmark's, since it was made, in cores.
    A thread samples every `every` seconds (a short-lived process of someone else's is seen
    if it lives that long); a process once ours stays ours, so a child that outlives its
    parent (reparented) is not counted against the machine."""

    def __init__(self, every: float = 1.0) -> None:
        self.began = time.monotonic()
        self._seen = _proc_ticks()
        self._mine = _ours(self._seen)
        self.other_ticks = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._run, args=(every,), daemon=True, name="load-meter").start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.sample()

    def sample(self) -> float:
        """Adds what others used since the last sample; returns the average so far, in cores."""
        with self._lock:
            now = _proc_ticks()
            self._mine |= _ours(now)
            for pid, (_, ticks) in now.items():
                if pid not in self._mine:
                    before = self._seen.get(pid)
                    self.other_ticks += max(0, ticks - (before[1] if before else 0))
            self._seen = now
        return self.cores()

    def stop(self) -> float:
        self._stop.set()
        return self.sample()

    def cores(self) -> float:
        elapsed = time.monotonic() - self.began
        return self.other_ticks / TICK / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        self.sample()
        return f"load: other processes used {self.cores():.2f} cores on average while this ran"


def machine() -> str:
    """The CPU model, how many cores this process may use, the kernel and Python."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0))
    return (f"machine: {cores} cores{f' ({model})' if model else ''}, Linux {platform.release()}, "
            f"Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f}")

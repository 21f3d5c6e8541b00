"""Prometheus text exposition for a replica: counters and histograms, no dependency."""

from __future__ import annotations

import bisect
import threading

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in sorted(labels.items()))
    return "{" + inner + "}"


class Counter:
    def __init__(self, name: str, help_: str):
        self.name, self.help = name, help_
        self.values: dict[tuple, float] = {}
        self._lock = threading.Lock()

    def inc(self, value: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self.values[key] = self.values.get(key, 0.0) + value

    def get(self, **labels: str) -> float:
        return self.values.get(tuple(sorted(labels.items())), 0.0)

    def render(self, const: dict[str, str]) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        for key, v in sorted(self.values.items()):
            lines.append(f"{self.name}{_labels({**const, **dict(key)})} {v:g}")
        return lines


class Histogram:
    def __init__(self, name: str, help_: str, buckets: tuple):
        self.name, self.help, self.buckets = name, help_, tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.buckets, value)] += 1
            self.sum += value
            self.count += 1

    def render(self, const: dict[str, str]) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, c in zip(self.buckets, self.counts):
            running += c
            lines.append(f"{self.name}_bucket{_labels({**const, 'le': f'{bound:g}'})} {running}")
        lines.append(f"{self.name}_bucket{_labels({**const, 'le': '+Inf'})} {self.count}")
        lines.append(f"{self.name}_sum{_labels(const)} {self.sum:g}")
        lines.append(f"{self.name}_count{_labels(const)} {self.count}")
        return lines


class ReplicaMetrics:
    def __init__(self, **const: str):
        self.const = const
        self.requests = Counter("deeppod_predict_requests_total", "Predict requests by HTTP status code.")
        self.items = Counter("deeppod_predict_items_total", "Images or tensors predicted.")
        self.latency = Histogram("deeppod_predict_latency_seconds", "Predict request latency in the replica.",
                                 LATENCY_BUCKETS)
        self.batch_size = Histogram("deeppod_batch_size", "Items per forward pass.", BATCH_BUCKETS)
        self.batch_seconds = Histogram("deeppod_batch_seconds", "Seconds per forward pass.", LATENCY_BUCKETS)

    def render(self, queue_depth: int = 0, inflight: int = 0) -> str:
        lines = []
        for m in (self.requests, self.items, self.latency, self.batch_size, self.batch_seconds):
            lines += m.render(self.const)
        for name, help_, v in (("deeppod_queue_depth", "Items waiting for a batch.", queue_depth),
                               ("deeppod_inflight_requests", "Requests being answered.", inflight)):
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name}{_labels(self.const)} {v}"]
        return "\n".join(lines) + "\n"


def merge(texts: list[str]) -> str:
    """Several replicas' expositions as one: each family's HELP/TYPE once, its samples together."""
    families: dict[str, list[str]] = {}
    headers: dict[str, list[str]] = {}
    for text in texts:
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("# "):
                parts = line.split(" ", 3)
                if len(parts) >= 3:
                    fam = headers.setdefault(parts[2], [])
                    families.setdefault(parts[2], [])
                    if line not in fam:
                        fam.append(line)
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            family = next((f for f in (name, name.rsplit("_", 1)[0]) if f in families), name)
            families.setdefault(family, []).append(line)
    out = []
    for family, samples in families.items():
        out += headers.get(family, []) + samples
    return "\n".join(out) + ("\n" if out else "")

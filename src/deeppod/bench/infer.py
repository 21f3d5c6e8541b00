"""``deeppod bench infer``: a closed-loop load generator (N clients, each sends its next
request when the last is answered) reporting throughput and p50/p99 latency, against a
deployment and, in the same run, against a plain FastAPI + torch server that runs one
request per forward pass with the same model."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from deeppod.contract import free_port


def export_model(out: Path, name: str, size: int, classes: int = 1000) -> None:
    """A torchvision model with random weights in the serving form a registered model has
    (serving speed does not depend on the weights)."""
    import torch
    import torchvision

    out.mkdir(parents=True)
    model = torchvision.models.get_model(name, weights=None, num_classes=classes).eval()
    torch.save(model.state_dict(), out / "weights.pt")
    program = torch.export.export(model, (torch.zeros(2, 3, size, size),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))
    torch.export.save(program, str(out / "model.pt2"))
    (out / "signature.json").write_text(json.dumps({
        "task": "image-classification", "model": name, "classes": [f"class-{i}" for i in range(classes)],
        "input": {"kind": "image", "shape": [3, size, size], "dtype": "float32", "resize": [size, size],
                  "color": "RGB", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "crop": "center"},
        "metrics": {}}))


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def closed_loop(url: str, body: bytes, content_type: str, *, concurrency: int, duration: float,
                headers: dict[str, str] | None = None, warmup: float = 2.0, keep_latencies: bool = False) -> dict:
    """``concurrency`` clients on keep-alive connections for ``duration`` seconds (after a warm-up).
    ``keep_latencies``: the answer has every latency (seconds, sorted) too, to merge runs."""
    u = urllib.parse.urlsplit(url)
    path = u.path + (f"?{u.query}" if u.query else "")
    hdrs = {"Content-Type": content_type, **(headers or {})}
    start_at = time.monotonic() + warmup
    end_at = start_at + duration
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[str] = []

    def client(i: int) -> None:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        while True:
            t0 = time.monotonic()
            if t0 >= end_at:
                break
            try:
                conn.request("POST", path, body=body, headers=hdrs)
                r = conn.getresponse()
                r.read()
                ok = r.status == 200
                if not ok:
                    errors.append(f"HTTP {r.status}")
            except (OSError, http.client.HTTPException) as exc:
                errors.append(type(exc).__name__)
                conn.close()
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
                ok = False
            t1 = time.monotonic()
            if ok and t0 >= start_at and t1 <= end_at:
                latencies[i].append(t1 - t0)
        conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat = sorted(v for per in latencies for v in per)
    out = {"concurrency": concurrency, "requests": len(lat), "errors": len(errors),
           "throughput_rps": round(len(lat) / duration, 2),
           "p50_ms": round(_percentile(lat, 0.50) * 1000, 2), "p99_ms": round(_percentile(lat, 0.99) * 1000, 2)}
    if keep_latencies:
        out["latencies"] = lat
    return out


def merged(runs: list[dict], duration: float) -> dict:
    """Runs of :func:`closed_loop` (with their latencies) taken as one of ``duration`` seconds."""
    lat = sorted(v for r in runs for v in r["latencies"])
    return {"concurrency": runs[0]["concurrency"], "requests": len(lat), "errors": sum(r["errors"] for r in runs),
            "throughput_rps": round(len(lat) / duration, 2),
            "p50_ms": round(_percentile(lat, 0.50) * 1000, 2), "p99_ms": round(_percentile(lat, 0.99) * 1000, 2)}


class PlainServer:
    """The baseline in its own process: FastAPI + uvicorn + torch, one forward per request."""

    def __init__(self, model_dir: str | Path, threads: int | None = None):
        self.port = free_port()
        env = dict(os.environ)
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        self.proc = subprocess.Popen([sys.executable, "-m", "deeppod.bench.plain_server", str(model_dir),
                                      str(self.port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{self.port}/predict"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the baseline server exited: " + self.proc.stderr.read().decode()[-2000:])
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the baseline server did not start in 120 s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def compare(target_url: str, headers: dict[str, str], body: bytes, content_type: str, *, model_dir: str | None,
            concurrencies: list[int], duration: float, echo=print) -> dict:
    """Both servers at every concurrency, one after the other (never at the same time)."""
    rows = {"deeppod": [], "baseline": []}
    for n in concurrencies:
        r = closed_loop(target_url, body, content_type, concurrency=n, duration=duration, headers=headers)
        rows["deeppod"].append(r)
        echo(f"deeppod   c={n:<3} {r['throughput_rps']:8.1f} req/s  p50 {r['p50_ms']:8.1f} ms  "
             f"p99 {r['p99_ms']:8.1f} ms  errors {r['errors']}")
    if model_dir is not None:
        plain = PlainServer(model_dir)
        try:
            for n in concurrencies:
                r = closed_loop(plain.url, body, content_type, concurrency=n, duration=duration)
                rows["baseline"].append(r)
                echo(f"baseline  c={n:<3} {r['throughput_rps']:8.1f} req/s  p50 {r['p50_ms']:8.1f} ms  "
                     f"p99 {r['p99_ms']:8.1f} ms  errors {r['errors']}")
        finally:
            plain.close()
        for d, b in zip(rows["deeppod"], rows["baseline"]):
            ratio = d["throughput_rps"] / b["throughput_rps"] if b["throughput_rps"] else float("inf")
            d["throughput_ratio"] = round(ratio, 2)
            echo(f"c={d['concurrency']:<3} throughput {ratio:.2f}x the baseline; p99 {d['p99_ms']:.0f} ms vs "
                 f"{b['p99_ms']:.0f} ms")
    return rows

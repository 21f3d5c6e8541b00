"""Storage benchmark in the MLPerf Storage way: N emulated accelerators each take a batch,
"compute" on it by sleeping the time a real accelerator would (resnet50 on H100: batch
400, 0.224 s per step), and the accelerator utilisation AU = compute time / wall time says
whether storage and the input pipeline keep up (MLPerf's bar: AU >= 90%). Plus raw
sequential and random read throughput of the data folder with several threads (fio-like).

Two modes: ``loader`` reads through deeppod.runtime.data (decode + crop: what training
sees); ``raw`` reads the records' bytes only (what MLPerf Storage measures).
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class AuResult:
    accelerators: int
    mode: str
    au: float
    samples_per_second: float
    seconds: float


def _accelerator(version: Path, mode: str, batch: int, steps: int, compute: float, workers: int, size: int,
                 seed: int, out: list) -> None:
    from deeppod.runtime.data import ImageDataset, ShardReader, loader

    busy = 0.0
    began = time.perf_counter()
    rng = random.Random(seed)
    if mode == "raw":
        reader = ShardReader(version)
        n = len(reader)

        def fetch(_):  # one batch of record bytes, read for real
            return sum(len(bytes(reader.read(rng.randrange(n))[0])) for _ in range(batch))

        with ThreadPoolExecutor(1) as pool:  # one batch read ahead while the accelerator computes
            pending = pool.submit(fetch, 0)
            for step in range(steps):
                pending.result()
                if step + 1 < steps:
                    pending = pool.submit(fetch, step + 1)
                time.sleep(compute)
                busy += compute
    else:
        ds = ImageDataset(version, None, size=size, seed=seed)
        n = len(ds)
        order = [rng.randrange(n) for _ in range(batch * steps)]
        for _x, _y in loader(ds, batch_size=batch, sampler=order, workers=workers, prefetch=2):
            time.sleep(compute)
            busy += compute
    out.append((busy, time.perf_counter() - began))


def accelerator_utilisation(version: Path, accelerators: int, *, mode: str = "raw", batch: int = 400,
                            compute: float = 0.224, steps: int = 10, workers: int = 1, size: int = 224) -> AuResult:
    results: list = []
    threads = [threading.Thread(target=_accelerator, args=(version, mode, batch, steps, compute, workers, size, k,
                                                           results)) for k in range(accelerators)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    au = sum(b for b, _ in results) / sum(w for _, w in results)
    return AuResult(accelerators, mode, round(au, 4), round(accelerators * batch * steps / wall, 1), round(wall, 2))


def max_accelerators(version: Path, *, mode: str, batch: int, compute: float, steps: int, workers: int, size: int,
                     limit: int = 64, echo=print) -> tuple[int, list[AuResult]]:
    """Doubles N while AU >= 90%; the largest passing N."""
    best, rows, n = 0, [], 1
    while n <= limit:
        r = accelerator_utilisation(version, n, mode=mode, batch=batch, compute=compute, steps=steps,
                                    workers=workers, size=size)
        rows.append(r)
        echo(f"  {mode:6s} N={n:3d}  AU {r.au * 100:5.1f}%  {r.samples_per_second:9.1f} samples/s")
        if r.au < 0.9:
            break
        best, n = n, n * 2
    return best, rows


def read_throughput(folder: Path, *, threads: int = 4, block: int = 4 << 20, random_block: int = 128 << 10,
                    random_reads: int = 2000) -> dict:
    """Sequential: every file front to back in ``block`` reads; random: ``random_reads``
    reads of ``random_block`` at random offsets. Both with ``threads`` threads."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)

    def sequential(path: Path) -> int:
        n = 0
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(block):
                n += len(chunk)
        return n

    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        read = sum(pool.map(sequential, files))
    seq = read / (time.perf_counter() - began)
    big = [p for p in files if p.stat().st_size > random_block] or files
    rng = random.Random(0)
    plan = [(p, rng.randrange(max(1, p.stat().st_size - random_block))) for p in rng.choices(big, k=random_reads)]

    def one(item) -> int:
        path, offset = item
        fd = os.open(path, os.O_RDONLY)
        try:
            return len(os.pread(fd, random_block, offset))
        finally:
            os.close(fd)

    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        read = sum(pool.map(one, plan))
    rand_s = time.perf_counter() - began
    return {"files": len(files), "bytes": total, "threads": threads,
            "sequential_MBps": round(seq / 1e6, 1), "random_MBps": round(read / rand_s / 1e6, 1),
            "random_iops": round(random_reads / rand_s, 1), "random_block": random_block}


def as_dicts(rows: list[AuResult]) -> list[dict]:
    return [asdict(r) for r in rows]

"""The sizing model. Each figure is arithmetic over the workload, with its reason kept:

- **GPUs for one run**: the images to read (images x epochs) over the target time, at the
  per-GPU training rate (measured: ``deeppod bench train``, or a published figure), less the
  scaling efficiency of data parallelism past one GPU.
- **GPUs for the team**: the users' runs arrive as a Poisson stream; the scheduler's own
  simulator (scheduler/simulator.py) replays two weeks of it at each candidate size, a node
  at a time, and the smallest size whose 95th-percentile wait meets the target is taken.
- **CPU cores per GPU**: what feeds a GPU at its rate, at DeepPod's loader rate per core
  (measured: 700-800 JPEG images/s per core with region decoding, docs/benchmarks.md), plus
  one for the training process.
- **Storage**: read throughput for every training GPU busy at once; capacity for the
  dataset's versions kept.
- **Serving**: the inference rate over a GPU's measured rate.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from deeppod.errors import InvalidRequest

LOADER_IMAGES_PER_CORE = 700.0  # runtime.data with region decoding, 224-px crops of 500-px JPEGs (docs/benchmarks.md)
UTILIZATION_CAP = 0.95  # a queue never drains above this: candidate sizes start where the load is below it
DAYS = 14  # of arrivals replayed per candidate size
AFTER = 2  # sizes simulated past the one chosen: how the wait falls beyond it
MAX_GPUS = 10_000_000  # past this a figure is a typo (hours for seconds), or not finite at all


@dataclass(frozen=True)
class Workload:
    images: int  # in the training dataset
    epochs: float
    hours: float  # the time a run should take
    images_per_gpu: float  # training images/s one GPU sustains (bench train, or a published figure)
    image_kb: float = 110.0  # mean stored image (ImageNet's JPEGs: 110 KB)
    users: int = 1
    runs_per_user_day: float = 1.0
    wait_minutes: float = 30.0  # the 95th-percentile queueing delay to stay under
    job_gpus: int | None = None  # GPUs a run uses (default: what meets ``hours``)
    scaling: float = 0.9  # data-parallel efficiency past one GPU
    inference_rps: float = 0.0
    rps_per_gpu: float = 0.0
    gpus_per_node: int = 8
    loader_images_per_core: float = LOADER_IMAGES_PER_CORE
    versions: int = 3  # dataset versions kept (capacity)
    simulate: bool = True
    seed: int = 0

    def check(self) -> None:
        for name in ("images", "epochs", "hours", "images_per_gpu", "image_kb", "users", "runs_per_user_day",
                     "gpus_per_node", "loader_images_per_core", "versions"):
            if getattr(self, name) <= 0:
                raise InvalidRequest(f"--{name.replace('_', '-')} must be above 0 (got {getattr(self, name)})")
        if not 0 < self.scaling <= 1:
            raise InvalidRequest(f"--scaling is an efficiency between 0 and 1 (got {self.scaling})")
        try:  # GPUs for one run, roughly
            need = self.images * self.epochs / self.hours / 3600 / self.images_per_gpu
        except (ZeroDivisionError, OverflowError):
            need = math.inf
        if not math.isfinite(need) or need > MAX_GPUS:
            raise InvalidRequest(f"a run would need more than {MAX_GPUS:,} GPUs: check --hours, --epochs and "
                                 "--images-per-gpu")
        if self.inference_rps and not self.rps_per_gpu:
            raise InvalidRequest("--inference-rps needs --rps-per-gpu: what one GPU serves (deeppod bench infer, "
                                 "or the model's published figure)")
        if self.inference_rps and self.inference_rps / self.rps_per_gpu > MAX_GPUS:
            raise InvalidRequest(f"serving would need more than {MAX_GPUS:,} GPUs: check --inference-rps and "
                                 "--rps-per-gpu")


@dataclass
class Recommendation:
    gpus: int
    nodes: int
    training_gpus: int
    inference_gpus: int
    job_gpus: int
    run_hours: float
    cpus_per_gpu: int
    read_gb_s: float
    capacity_tb: float
    waits: list[dict] = field(metadata={"description": "per size simulated: gpus, p95_wait_min, mean_wait_min"})
    why: list[str]

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("gpus", "nodes", "training_gpus", "inference_gpus", "job_gpus",
                                              "run_hours", "cpus_per_gpu", "read_gb_s", "capacity_tb", "waits", "why")}


def efficiency(gpus: int, scaling: float) -> float:
    return 1.0 if gpus <= 1 else scaling


def _n(count: float, word: str) -> str:
    """'1 GPU', '4 GPUs', '0.5 runs': the count and its word, plural unless it is one."""
    return f"{count:,g} {word}" + ("" if count == 1 else "s")


def gpus_for(images_per_s: float, per_gpu: float, scaling: float) -> int:
    n = max(1, math.ceil(images_per_s / per_gpu))
    while n * per_gpu * efficiency(n, scaling) < images_per_s:
        n += 1
    return n


def size(w: Workload, stop=None) -> Recommendation:
    """``stop()``: true when the simulations should end now (a time budget spent, a client gone):
    the sizes tried so far answer, and the reasons say so."""
    w.check()
    why = []
    need_rate = w.images * w.epochs / (w.hours * 3600)
    one_run = gpus_for(need_rate, w.images_per_gpu, w.scaling)
    job = w.job_gpus or one_run
    run_h = w.images * w.epochs / (job * w.images_per_gpu * efficiency(job, w.scaling)) / 3600
    why.append(f"a run reads {w.images:,} x {w.epochs:g} images; in {w.hours:g} h that is {need_rate:,.0f} images/s, "
               f"{_n(one_run, 'GPU')} at {w.images_per_gpu:,.0f} images/s each"
               + (f" ({w.scaling:.0%} efficient past one)" if one_run > 1 else "")
               + (f"; runs use {_n(job, 'GPU')} and take {run_h:.1f} h" if job != one_run else ""))
    per_day = w.users * w.runs_per_user_day
    gpu_hours_day = per_day * job * run_h
    least = max(job, math.ceil(gpu_hours_day / 24 / UTILIZATION_CAP))
    training = _round_to_nodes(least, w.gpus_per_node)
    why.append(f"{_n(w.users, 'user')} x {_n(w.runs_per_user_day, 'run')} a day = {gpu_hours_day:,.0f} GPU-hours a "
               f"day: at least {_n(least, 'GPU')} to keep up")
    waits = []
    if w.simulate:
        training, waits, cut = _by_simulation(w, job, run_h * 3600, per_day, training, stop)
        if cut:
            why.append(f"the simulations were stopped after {_n(len(waits), 'size')}, before one met the wait target: "
                       f"{training} GPUs is the last tried ('deeppod size' simulates without a time limit)")
        met = next((x for x in waits if x["gpus"] == training), None)
        if met is not None:
            why.append(f"the scheduler's simulator, replaying {DAYS} days of these runs: {training} GPUs keep the "
                       f"95th-percentile wait at {met['p95_wait_min']:.0f} min (target {w.wait_minutes:g})")
    inference = math.ceil(w.inference_rps / w.rps_per_gpu) if w.inference_rps else 0
    if inference:
        why.append(f"serving {w.inference_rps:,.0f} requests/s at {w.rps_per_gpu:,.0f} per GPU: {_n(inference, 'GPU')}")
    total = training + inference
    cpus = math.ceil(w.images_per_gpu / w.loader_images_per_core) + 1
    why.append(f"a GPU eats {w.images_per_gpu:,.0f} images/s; DeepPod's loader decodes {w.loader_images_per_core:,.0f} "
               f"a core: {cpus} cores per GPU (one for the training process)")
    read = training * w.images_per_gpu * w.image_kb * 1e3 / 1e9
    capacity = w.images * w.image_kb * 1e3 * w.versions / 1e12
    why.append(f"every training GPU reading at once: {read:.2f} GB/s; {_n(w.versions, 'version')} of "
               f"{w.images:,} images of {w.image_kb:g} KB: {capacity:.2f} TB (identical files are stored once)")
    return Recommendation(total, math.ceil(total / w.gpus_per_node), training, inference, job, round(run_h, 2),
                          cpus, round(read, 2), round(capacity, 3), waits, why)


def _round_to_nodes(gpus: int, per_node: int) -> int:
    """Up to whole nodes once more than one is needed (less than a node stays as asked)."""
    return math.ceil(gpus / per_node) * per_node if gpus > per_node else gpus


def _by_simulation(w: Workload, job: int, run_s: float, per_day: float, start: int,
                   stop=None) -> tuple[int, list[dict], bool]:
    """The smallest size, node by node from ``start`` (run by run below one node: a size between
    two multiples of a run's GPUs holds no more runs at once), whose simulated p95 wait meets the target;
    the waits at each size tried, and at the next ``AFTER`` sizes (the curve past it); whether
    ``stop()`` cut the search short before a size met the target."""
    from deeppod.scheduler.simulator import SimConfig, Simulator, TraceJob, proportional_plan

    rng = random.Random(w.seed)
    trace, t, i = [], 0.0, 0
    while t < DAYS * 86400:
        t += rng.expovariate(per_day / 86400)
        trace.append(TraceJob(i, f"user{i % w.users}", t, run_s, job))
        i += 1
    step = w.gpus_per_node
    waits, gpus, chosen, chosen_at = [], start, None, 0
    for _ in range(64):
        if waits and stop is not None and stop():
            return chosen or waits[-1]["gpus"], waits, chosen is None
        nodes = max(1, math.ceil(gpus / step))
        per_node = min(step, gpus)
        cfg = SimConfig(nodes=nodes, gpus_per_node=per_node, seed=w.seed, horizon=(DAYS + 30) * 86400.0)
        r = Simulator(trace, proportional_plan(trace, nodes * per_node), cfg).run()
        p95 = (r.get("queue_delay_p95_h") or 0.0) * 60
        waits.append({"gpus": nodes * per_node, "p95_wait_min": round(p95, 1),
                      "mean_wait_min": round((r.get("queue_delay_avg_h") or 0.0) * 60, 1)})
        if chosen is None and p95 <= w.wait_minutes:
            chosen, chosen_at = nodes * per_node, len(waits)
        if chosen is not None and len(waits) >= chosen_at + AFTER:
            return chosen, waits, False
        gpus = nodes * per_node + (step if nodes * per_node >= step else job)
    return chosen or waits[-1]["gpus"], waits, False

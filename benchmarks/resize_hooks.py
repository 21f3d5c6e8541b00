"""What :meth:`deeppod.runtime.Resizer.interruptible` costs a training step: the same model
trained with and without its hooks, side by side in one process, in interleaved rounds.

    python benchmarks/resize_hooks.py [--model resnet50] [--batch-size 256] [--image-size 224]
                                      [--steps 30] [--rounds 5] [--out FILE]

The hooked model runs each step's forward and backward pass inside ``interruptible()``, with a
world file there (so the hooks look for a new world, a stat at most every 20 ms) that never
changes (so no step is given up): what every step of a resizable job pays. The plain model is
the same one, built from the same seed, with no Resizer. On CUDA both use AMP (float16 with a
gradient scaler, as the built-in trainer does) and channels_last; on CPU neither. Each round
times ``--steps`` steps of each, after a warm-up of 5 steps each; the order rotates by round.
A third arm, the control, is a second plain model built the same way: control / plain is
what the same step measures against itself, so its spread is the noise that hooked / plain
has to be read against (``--no-control`` leaves it out). Prints images/s per round, and the
ratios per round with their median and range. Aim: the worst round >= 0.99 (the hooks cost
under 1% of a step), or, where control / plain itself spreads wider than that, hooked / plain
within control / plain's range.

Then ``--give-ups`` times, a new world is written at a random point of a hooked step (10-90% of
its time): how long from the write until the worker is free (the step given up or ended, and
its device drained), and whether the step was given up. On a GPU the host queues a step's
kernels ahead of the device, so the hooks, which run as the host queues, can only look while
the host is still queueing: the time the device then needs to drain the queue is in the figure.
After each, the Resizer takes the new world as a switch to the same size would (the benchmark
sets its generation).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path


def build(name: str, seed: int, device, channels_last: bool):
    import torch
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.get_model(name, weights=None).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


class Arm:
    """One model, its optimizer and scaler, and (hooked) its Resizer's interruptible()."""

    def __init__(self, model, device, amp: bool, resizer=None):
        import torch

        self.model, self.device, self.amp, self.resizer = model, device, amp, resizer
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp)
        self.loss_fn = torch.nn.CrossEntropyLoss()

    def step(self, x, y) -> None:
        import torch

        around = self.resizer.interruptible(True) if self.resizer else contextlib.nullcontext()
        with around:
            with torch.autocast(self.device.type, enabled=self.amp):
                loss = self.loss_fn(self.model(x), y)
            self.opt.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()

    def run(self, x, y, steps: int) -> float:
        """Images per second over ``steps`` steps (the device drained before and after)."""
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step(x, y)
        sync()
        return steps * len(y) / (time.perf_counter() - t0)


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=None, help="default: 256 on a GPU, 8 on CPU")
    ap.add_argument("--image-size", type=int, default=None, help="default: 224 on a GPU, 64 on CPU")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per system per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--give-ups", type=int, default=10, help="new worlds written during a hooked step")
    ap.add_argument("--no-control", dest="control", action="store_false",
                    help="leave out the second plain model (the noise's measure)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    a = ap.parse_args()

    import torch

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    batch, size = a.batch_size or (256 if cuda else 8), a.image_size or (224 if cuda else 64)
    if cuda:
        torch.backends.cudnn.benchmark = True
    with tempfile.TemporaryDirectory() as tmp:
        world = Path(tmp) / "world.json"
        world.write_text(json.dumps({"generation": 0, "world_size": 1}))
        os.environ["DEEPPOD_WORLD_FILE"] = str(world)  # read by the Resizer as it is built
        from deeppod.runtime import Resizer

        arms = {"plain": Arm(build(a.model, 0, device, cuda), device, cuda)}
        hooked_model = build(a.model, 0, device, cuda)
        arms["hooked"] = hooked = Arm(hooked_model, device, cuda, Resizer(hooked_model, None))
        if a.control:
            arms["control"] = Arm(build(a.model, 0, device, cuda), device, cuda)
        calls = count_calls(hooked, device, batch, size)
        g = torch.Generator(device="cpu").manual_seed(1)
        x = torch.randn(batch, 3, size, size, generator=g).to(device)
        if cuda:
            x = x.to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), generator=g).to(device)
        for arm in arms.values():
            arm.run(x, y, 5)
        rounds, names = [], list(arms)
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            rates = {name: arms[name].run(x, y, a.steps) for name in order}
            rates["ratio"] = rates["hooked"] / rates["plain"]
            line = f"round {r + 1}: " + ", ".join(f"{n} {rates[n]:8.1f}" for n in names) + \
                f" images/s; hooked / plain {rates['ratio']:.4f}"
            if a.control:
                rates["control_ratio"] = rates["control"] / rates["plain"]
                line += f", control / plain {rates['control_ratio']:.4f}"
            rounds.append(rates)
            print(line, flush=True)
        step_s = batch / statistics.median(r["hooked"] for r in rounds)
        worlds = give_ups(hooked, x, y, world, a.give_ups, step_s)
    ratios = [r["ratio"] for r in rounds]
    machine = torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or platform.machine()}, " \
                                                         f"{torch.get_num_threads()} threads)"
    result = {"model": a.model, "batch_size": batch, "image_size": size, "device": machine, "amp": cuda,
              "channels_last": cuda, "steps": a.steps, "hook_calls_per_step": calls, "rounds": rounds,
              "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
              "ratio_of_means": mean_ratio(rounds, "hooked"), "step_seconds": step_s, "give_ups": worlds}
    if a.control:
        controls = [r["control_ratio"] for r in rounds]
        result.update(control_median=statistics.median(controls), control_min=min(controls),
                      control_max=max(controls), control_of_means=mean_ratio(rounds, "control"))
    print(f"{a.model}, batch {batch}, {size} px on {machine}: {calls} hook calls a step; hooked / plain "
          f"median {result['ratio_median']:.4f} (worst {result['ratio_min']:.4f}, best {result['ratio_max']:.4f}) "
          f"over {a.rounds} rounds of {a.steps} steps; ratio of the means {result['ratio_of_means']:.4f}")
    if a.control:
        print(f"the noise: control / plain median {result['control_median']:.4f} (worst {result['control_min']:.4f}, "
              f"best {result['control_max']:.4f}); ratio of the means {result['control_of_means']:.4f}")
    if worlds:
        free = [w["free_after_s"] for w in worlds]
        print(f"a new world during a step of {step_s * 1000:.1f} ms: given up in {sum(w['gave_up'] for w in worlds)} "
              f"of {len(worlds)}; the worker free {statistics.median(free) * 1000:.1f} ms after the write "
              f"(median; {min(free) * 1000:.1f}-{max(free) * 1000:.1f} ms)")
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))


def mean_ratio(rounds: list[dict], arm: str) -> float:
    """The arm's mean rate over the plain model's, across rounds (steadier than a round's ratio)."""
    return statistics.fmean(r[arm] for r in rounds) / statistics.fmean(r["plain"] for r in rounds)


def give_ups(arm: Arm, x, y, world: Path, n: int, step_s: float) -> list[dict]:
    """A new world written at a random point of a step, ``n`` times (module doc)."""
    from deeppod.errors import StepAbandoned

    resizer, rng, out = arm.resizer, random.Random(0), []
    for _ in range(n):
        generation, delay, written = resizer.generation + 1, rng.uniform(0.1, 0.9) * step_s, []

        def write(generation=generation, delay=delay, written=written):
            time.sleep(delay)  # the point of the step at which the control plane writes
            tmp = world.with_suffix(".tmp")
            tmp.write_text(json.dumps({"generation": generation, "world_size": 1}))
            os.replace(tmp, world)
            written.append(time.perf_counter())

        sync()
        writer = threading.Thread(target=write)
        writer.start()
        try:
            arm.step(x, y)
            gave_up = False
        except StepAbandoned:
            gave_up = True
        sync()
        done = time.perf_counter()
        writer.join()
        if written and written[0] <= done:  # else the write came after the step: not counted
            out.append({"delay_s": delay, "gave_up": gave_up, "free_after_s": done - written[0]})
        # as a switch to the same size would: the Resizer is at the new world, its step not given up
        resizer.generation = resizer._seen = resizer._agreed = generation
        resizer._gave_up = False
        resizer._look()
    return out


def count_calls(arm: Arm, device, batch: int, size: int) -> int:
    """How many times the hooks run in one step (the Resizer's poll, counted once on a copy)."""
    import torch

    resizer, n = arm.resizer, 0
    poll = resizer._poll

    def counted():
        nonlocal n
        n += 1
        poll()

    resizer._poll = counted
    try:
        x = torch.randn(2, 3, size, size, device=device)
        arm.step(x.to(memory_format=torch.channels_last) if device.type == "cuda" else x,
                 torch.zeros(2, dtype=torch.long, device=device))
    finally:
        del resizer._poll
    return n


if __name__ == "__main__":
    main()

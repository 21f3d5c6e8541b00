"""The objective that benchmarks/tune.py searches, the same code for every system: a small CNN
trained with SGD on one of two image tasks, validation accuracy after every epoch.

- ``digits``: scikit-learn's 8x8 handwritten digits (1,797 images, 10 classes; shipped with
  the package), 80/20 split, random one-pixel shifts while training.
- ``gratings``: a harder synthetic task generated here: 16x16 sinusoidal gratings whose
  orientation (10 bins over 180 degrees) is the class, with random frequency, phase and
  contrast under heavy Gaussian noise; 3,000 training and 1,000 validation images.

The driver writes each task's split once (``prepare``) and every trial reads it (``--data``).
Run as a DeepPod trial (parameters as flags; one ``runtime.report`` per epoch, stops when the
pruner says so) or imported by the baselines (``train(params, task, epochs, on_epoch)``).
Every epoch appends ``{"at", "trial", "epoch", "acc"}`` to ``--log`` so the benchmark reads the
same clock for every system.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

EPOCHS = 27  # ASHA's rungs at 1, 3, 9 and 27 epochs with reduction factor 3
SPACE = {
    "lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
    "momentum": {"type": "float", "low": 0.0, "high": 0.99},
    "weight_decay": {"type": "float", "low": 1e-6, "high": 1e-2, "log": True},
    "batch_size": {"type": "categorical", "choices": [16, 32, 64, 128]},
    "channels": {"type": "categorical", "choices": [8, 16, 32]},
}


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


def _gratings(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    theta = (y + rng.uniform(0, 1, n)) * math.pi / 10
    freq = rng.uniform(0.15, 0.45, n)
    phase = rng.uniform(0, 2 * math.pi, n)
    contrast = rng.uniform(0.3, 1.0, n)
    yy, xx = np.mgrid[0:16, 0:16].astype(np.float32) - 7.5
    proj = np.cos(theta)[:, None, None] * xx + np.sin(theta)[:, None, None] * yy
    img = contrast[:, None, None] * np.sin(2 * math.pi * freq[:, None, None] * proj + phase[:, None, None])
    img += rng.normal(0, 0.8, img.shape)
    return img.astype(np.float32), y.astype(np.int64)


def prepare(task: str, path: str) -> None:
    """Write the task's split to ``path`` (.npz) once, as a platform stages a dataset: every
    trial reads files, none imports scikit-learn or generates data again."""
    np.savez(path, *_generate(task))


@functools.lru_cache(maxsize=4)
def load(task: str, data: str | None = None):
    """(train_x, train_y, val_x, val_y) as tensors of shape (N, 1, H, W), from ``data`` (see
    :func:`prepare`) when given. Kept: a process that runs trial after trial (Optuna's loop, a
    reused DeepPod process) reads it once; training never writes to it."""
    if data:
        with np.load(data) as f:
            parts = tuple(f[f"arr_{i}"] for i in range(4))
    else:
        parts = _generate(task)
    tx, ty, vx, vy = (torch.from_numpy(a) for a in parts)
    return tx[:, None], ty, vx[:, None], vy


def _generate(task: str) -> tuple:
    if task == "digits":
        x, y = _digits()
        perm = np.random.default_rng(0).permutation(len(y))
        x, y = x[perm], y[perm]
        cut = int(len(y) * 0.8)
        parts = x[:cut], y[:cut], x[cut:], y[cut:]
    elif task == "gratings":
        parts = (*_gratings(3000, 1), *_gratings(1000, 2))
    else:
        raise SystemExit(f"unknown task {task!r}: use digits or gratings")
    return parts


class Net(nn.Module):
    def __init__(self, channels: int, size: int):
        super().__init__()
        self.c1 = nn.Conv2d(1, channels, 3, padding=1)
        self.c2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.c3 = nn.Conv2d(2 * channels, 2 * channels, 3, padding=1)
        self.fc = nn.Linear(2 * channels * (size // 4) ** 2, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c2(F.relu(self.c1(x)))), 2)
        x = F.max_pool2d(F.relu(self.c3(x)), 2)
        return self.fc(x.flatten(1))


def _shift(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    dx, dy = (int(v) for v in torch.randint(-1, 2, (2,), generator=g))
    return torch.roll(x, shifts=(dy, dx), dims=(2, 3))


class Run:
    """One configuration's training: its model, optimizer, random stream and the epoch it
    reached, so that a paused trial goes on where it stopped (``trial.keep(run)``)."""

    def __init__(self, params: dict, task: str, data: str | None = None):
        torch.manual_seed(0)
        self.task, self.data = task, data
        tx = load(task, data)[0]
        self.net = Net(int(params["channels"]), tx.shape[-1])
        self.opt = torch.optim.SGD(self.net.parameters(), lr=float(params["lr"]), momentum=float(params["momentum"]),
                                   weight_decay=float(params["weight_decay"]))
        self.bs, self.g, self.acc, self.epoch = int(params["batch_size"]), torch.Generator().manual_seed(0), 0.0, 0

    def go(self, epochs: int, on_epoch) -> float:
        """Train up to ``epochs``; ``on_epoch(epoch, acc)`` after each epoch returns True to stop
        early (a pruner's decision). Returns the last validation accuracy."""
        tx, ty, vx, vy = load(self.task, self.data)
        net, opt, g = self.net, self.opt, self.g
        for epoch in range(self.epoch, epochs):
            net.train()
            for idx in torch.randperm(len(ty), generator=g).split(self.bs):
                loss = F.cross_entropy(net(_shift(tx[idx], g)), ty[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            net.eval()
            with torch.no_grad():
                self.acc = float((net(vx).argmax(1) == vy).float().mean()) if torch.isfinite(loss) else 0.0
            self.epoch = epoch + 1
            if on_epoch(epoch, self.acc):
                break
        return self.acc


def train(params: dict, task: str, epochs: int, on_epoch, data: str | None = None) -> float:
    """Train with ``params`` from the start (see Run.go)."""
    return Run(params, task, data).go(epochs, on_epoch)


def log_line(path: str | None, trial: str, epoch: int, acc: float) -> None:
    if path:
        with open(path, "a") as f:  # one short line per write: appends from parallel trials stay whole
            f.write(json.dumps({"at": time.time(), "trial": trial, "epoch": epoch, "acc": acc}) + "\n")


def main() -> None:
    from deeppod import runtime

    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="digits")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--log")
    ap.add_argument("--data", help="the task's split written by prepare()")
    ap.add_argument("--reuse", action="store_true", help="trial after trial from runtime.trials(), no flags")
    for name, p in SPACE.items():
        ap.add_argument("--" + name.replace("_", "-"), type=int if p["type"] == "categorical" else float,
                        required="--reuse" not in sys.argv)
    args = ap.parse_args()
    job = os.environ.get("DEEPPOD_JOB_ID", "?")
    if args.reuse:  # torch imported and the data read once; each trial's values from the search
        load(args.task, args.data)
        for trial in runtime.trials():
            tag = f"{job}-{trial.number}"

            def on_epoch(epoch: int, acc: float, tag=tag, trial=trial) -> bool:
                log_line(args.log, tag, epoch, acc)
                runtime.report(epoch, val_acc=acc)
                return trial.should_stop()

            run = trial.kept or Run(trial.params, args.task, args.data)  # a promoted trial goes on where it paused
            run.go(args.epochs, on_epoch)
            trial.keep(run)
        return
    params = {name: getattr(args, name) for name in SPACE}

    def on_epoch(epoch: int, acc: float) -> bool:
        log_line(args.log, job, epoch, acc)
        runtime.report(epoch, val_acc=acc)
        return runtime.should_stop()

    train(params, args.task, args.epochs, on_epoch, args.data)
    if runtime.should_stop():
        runtime.exit_for_resume()


if __name__ == "__main__":
    main()

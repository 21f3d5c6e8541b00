"""Evaluate model versions on the same held-out data: ``python -m deeppod.runtime.evaluate``.

Run by ``deeppod models compare`` as a job. Every version sees every image through the
serving preprocessing (deeppod.runtime.inference), so the figures are what the deployed
model would answer. Writes accuracy and per-class samples/accuracy/precision/recall.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from deeppod.atomic import atomic_json


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, help="NAME[@VERSION], staged for this job")
    p.add_argument("--model", action="append", required=True, metavar="ID:VERSION=FOLDER",
                   help="a registered version's id, number and artifact folder (repeat)")
    p.add_argument("--output", required=True)
    p.add_argument("--split", choices=("auto", "val", "all"), default="auto",
                   help="auto: the validation split when the version has one, else every image")
    p.add_argument("--batch-size", type=int, default=64)
    return p.parse_args(argv)


def figures(classes: list[str], truth: list[str], predicted: list[str]) -> dict:
    """Accuracy and per-class samples, accuracy (recall) and precision."""
    per = {}
    for c in classes:
        tp = sum(1 for t, p in zip(truth, predicted) if t == c and p == c)
        n = sum(1 for t in truth if t == c)
        said = sum(1 for p in predicted if p == c)
        per[c] = {"samples": n, "accuracy": tp / n if n else None, "precision": tp / said if said else None}
    correct = sum(1 for t, p in zip(truth, predicted) if t == p)
    return {"samples": len(truth), "accuracy": correct / len(truth) if truth else 0.0, "per_class": per}


def main(argv=None) -> int:
    import torch

    from deeppod.runtime import inference
    from deeppod.runtime.data import ShardReader, dataset_path

    args = parse_args(argv)
    try:
        root = dataset_path(args.dataset)
    except FileNotFoundError as exc:
        sys.exit(str(exc))
    split = args.split
    if split == "auto":
        split = "val" if len(ShardReader(root, "val")) else "all"
    reader = ShardReader(root, None if split == "all" else split)
    if not len(reader):
        sys.exit(f"{args.dataset} has no images in split {split!r}")
    truth = [reader.classes[reader.read(i)[1]] for i in range(len(reader))]
    results = []
    for spec in args.model:
        ident, _, path = spec.partition("=")
        version_id, _, number = ident.partition(":")
        model = inference.load(path)
        began = time.perf_counter()
        predicted = []
        for start in range(0, len(reader), args.batch_size):
            batch = [inference.decode(reader.read(i)[0], model.signature)
                     for i in range(start, min(len(reader), start + args.batch_size))]
            probs = inference.forward(model, batch)
            predicted += [model.classes[i] for i in probs.argmax(1).tolist()]
        f = figures(sorted(set(reader.classes) | set(model.classes)), truth, predicted)
        missing = sorted(set(reader.classes) - set(model.classes))
        print(f"v{number}: accuracy {f['accuracy']:.4f} on {f['samples']} images "
              f"({time.perf_counter() - began:.1f} s)" + (f"; the model has no class {missing}" if missing else ""),
              flush=True)
        results.append({"version_id": int(version_id), "version": int(number), **f})
    atomic_json(Path(args.output), {"dataset": f"{args.dataset.split('@')[0]}@{root.name.lstrip('v')}",
                                    "split": split, "results": results, "torch_threads": torch.get_num_threads()},
                mode=0o644, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

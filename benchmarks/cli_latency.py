"""How long the CLI takes to answer, with no server to talk to: help texts, and the checks it
makes before it submits anything (a typo in --model, a missing folder). Aim: every command
under 1 s. Baseline: what checking a model name used to cost, importing torchvision to list
its models (the CLI answered 'deeppod train image-classifier --model resnt18' in 5-10 s).

    python benchmarks/cli_latency.py [--rounds 5] [--out FILE]

Each command runs as a new process (as a user runs it), rounds interleaved; the median and the
range of each are printed, and the ratio of the baseline to the typo check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {
    "deeppod --help": ["--help"],
    "deeppod jobs --help": ["jobs", "--help"],
    "deeppod train image-classifier --help": ["train", "image-classifier", "--help"],
    "deeppod train image-classifier --model resnt18": ["train", "image-classifier", "--data", "{tmp}",
                                                       "--model", "resnt18"],
    "deeppod tune image-classifier --model resnt18": ["tune", "image-classifier", "s", "--data", "{tmp}",
                                                      "--model", "resnt18"],
    "deeppod submit (no server)": ["submit", "--", "true"],
}
BASELINE = "import torchvision.models (the old model-name check)"


def run(argv: list[str], env: dict) -> float:
    began = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - began


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"DEEPPOD_CONFIG": str(Path(tmp) / "c.json"), "DEEPPOD_HOME": str(Path(tmp) / "home"),
                "DEEPPOD_API_URL": "http://127.0.0.1:9"})  # nothing listens: the checks, not a server
    argvs = {name: [sys.executable, "-m", "deeppod.cli", *(a.replace("{tmp}", tmp) for a in cmd)]
             for name, cmd in COMMANDS.items()}
    argvs[BASELINE] = [sys.executable, "-c", "import torchvision.models"]
    times: dict[str, list[float]] = {name: [] for name in argvs}
    for _ in range(args.rounds):  # interleaved: each command once per round
        for name, argv in argvs.items():
            times[name].append(run(argv, env))
    rows = {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)} for name, t in times.items()}
    for name, r in rows.items():
        print(f"{name:58s} median {r['median_s']:.2f} s  ({r['min_s']:.2f}-{r['max_s']:.2f})")
    typo = rows["deeppod train image-classifier --model resnt18"]["median_s"]
    print(f"baseline / typo check: {rows[BASELINE]['median_s'] / typo:.1f}x; slowest command "
          f"{max(r['median_s'] for n, r in rows.items() if n != BASELINE):.2f} s (aim < 1 s)")
    if args.out:
        Path(args.out).write_text(json.dumps({"rounds": args.rounds, "python": sys.version.split()[0],
                                              "cpus": os.cpu_count(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A search trial for the end-to-end tests: a score that rises with --x, reported each step
through the runtime; it checkpoints and exits for a resume when asked to stop."""

import argparse
import json
import math
import os
import time

from deeppod import runtime

p = argparse.ArgumentParser()
p.add_argument("--x", type=float, required=True)
p.add_argument("--steps", type=int, default=12)
args = p.parse_args()
ckpt = os.path.join(os.environ["DEEPPOD_CHECKPOINT_DIR"], "state.json")
start = json.load(open(ckpt))["step"] + 1 if os.path.exists(ckpt) else 0
assert float(os.environ["DEEPPOD_PARAM_X"]) == args.x
for step in range(start, args.steps):
    runtime.report(step, score=args.x * (1 - math.exp(-(step + 1) / 3)))
    time.sleep(0.25)
    if runtime.should_stop():
        json.dump({"step": step}, open(ckpt, "w"))
        print(f"stopping at step {step}", flush=True)
        runtime.exit_for_resume()
print("done", flush=True)

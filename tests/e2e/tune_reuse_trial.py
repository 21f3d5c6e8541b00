"""A search's script that runs trial after trial in one process (runtime.trials()): what it
loads before the loop is loaded once; each trial prints its number, the process's pid and the
step it starts at, and reports a score that rises with x until its pruner stops it. A trial
the search pauses (asha-promote) keeps the step it reached and goes on from it if promoted."""

import math
import os
import time

from deeppod import runtime

loaded_at = time.time()  # stands for torch imported and data loaded: once per process
for trial in runtime.trials():
    x, start = trial.params["x"], trial.kept or 0
    print(f"trial {trial.number} pid {os.getpid()} x {x} from step {start}", flush=True)
    step = start - 1
    for step in range(start, 10):
        runtime.report(step, score=x * (1 - math.exp(-(step + 1) / 3)))
        time.sleep(0.2)
        if trial.should_stop():
            print(f"trial {trial.number} {'paused' if trial.paused else 'stopped'} at step {step}", flush=True)
            break
    trial.keep(step + 1)
print("no more trials", flush=True)

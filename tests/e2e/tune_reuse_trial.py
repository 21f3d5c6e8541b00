"""A search's script that runs trial after trial in one process (runtime.trials()): what it
loads before the loop is loaded once; each trial prints its number and the process's pid,
and reports a score that rises with x until its pruner stops it."""

import math
import os
import time

from deeppod import runtime

loaded_at = time.time()  # stands for torch imported and data loaded: once per process
for trial in runtime.trials():
    x = trial.params["x"]
    print(f"trial {trial.number} pid {os.getpid()} x {x}", flush=True)
    for step in range(10):
        runtime.report(step, score=x * (1 - math.exp(-(step + 1) / 3)))
        time.sleep(0.2)
        if trial.should_stop():
            print(f"trial {trial.number} stopped at step {step}", flush=True)
            break
print("no more trials", flush=True)

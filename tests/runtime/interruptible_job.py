"""Two workers in DDP (gloo) whose step is given up for a new world (run by
tests/runtime/test_interruptible.py, one process per worker).

WRITER=RANK:PHASE:BLOCK: in step 2, that rank's block BLOCK writes world generation 1 (size
NEW_SIZE, port NEW_PORT) in its "forward" or "backward" pass. The writer's blocks take 2 *
POLL_S each; the other worker's take no time, so it waits in the step's all-reduce when the
writer gives the step up. KEEP=RANK: that rank keeps its old DDP wrapper (and with it the
old group) when it gives up. Each worker writes OUT/rank-R.json: the weights' checksum after
each step it applied, how it gave a step up, and the world it ended in.
"""

import json
import os
import sys
import time

import torch
from probe_blocks import blocks  # beside this script
from torch.nn.parallel import DistributedDataParallel as DDP

from deeppod import runtime
from deeppod.contract import ENV_WORLD_FILE
from deeppod.runtime.resize import POLL_S

STEPS = 4
out = sys.argv[1]
writer, phase, block = os.environ["WRITER"].split(":")
ctx = runtime.init()
slow = ctx.rank == int(writer)
record: dict = {"steps": [], "gave_up": None}
step = 0


def write_world() -> None:
    if step != 2 or not slow or os.path.exists(os.environ[ENV_WORLD_FILE]):
        return
    path = os.environ[ENV_WORLD_FILE]
    with open(path + ".tmp", "w") as f:
        json.dump({"generation": 1, "world_size": int(os.environ["NEW_SIZE"]), "master_addr": "127.0.0.1",
                   "master_port": int(os.environ["NEW_PORT"]), "decided_at": time.time()}, f)
    os.replace(path + ".tmp", path)


def on_pass(phase_now: str, index: int) -> None:
    if phase_now == phase and index == int(block):
        write_world()
    if slow:
        time.sleep(2 * POLL_S)


torch.manual_seed(0)
model = blocks(on_pass)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
resizer = runtime.Resizer(model, opt)
ddp = DDP(model)


def checksum() -> float:
    return round(float(sum(p.double().sum() for p in model.parameters())), 9)


while step < STEPS:
    x = torch.full((2, 4), float(step + 1))
    try:
        with resizer.interruptible():
            ddp(x).pow(2).sum().backward()
    except runtime.StepAbandoned as exc:
        opt.zero_grad(set_to_none=True)
        record["gave_up"] = {"step": step + 1, "why": str(exc), "weights": checksum()}
        assert resizer.check() == "resize"
        kept = ddp if os.environ.get("KEEP") == str(ctx.rank) else None  # code that keeps the old wrapper
        ddp = None  # the old group closes when nothing holds it
        json.dump(record, open(os.path.join(out, f"rank-{ctx.rank}.json"), "w"))  # a leaver exits in resize()
        if resizer.resize() == "stop":  # the old group could not be let go: a restart (exit 75) releases the peer
            record["stopped"] = True
            json.dump(record, open(os.path.join(out, f"rank-{ctx.rank}.json"), "w"))
            os._exit(75)
        ddp = DDP(model, init_sync=False) if resizer.world_size > 1 else model
        continue
    opt.step()
    opt.zero_grad(set_to_none=True)
    step += 1
    record["steps"].append(checksum())
    assert resizer.check() is None
record["world_size"] = resizer.world_size
json.dump(record, open(os.path.join(out, f"rank-{ctx.rank}.json"), "w"))
sys.stdout.flush()
os._exit(0)  # the interpreter's teardown of a group can abort (see resize_job.py)

"""A job that resizes in place (run by tests/runtime/test_resize.py, one process per worker).

Each step takes the next ``local_batch`` samples of this rank's share from the elastic
sampler, averages gradients by all-reduce and records the samples and a checksum of its
weights in OUT/rank-R.txt. ``stop`` saves a checkpoint (rank 0) and exits 75.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

from deeppod import runtime

out, n, local_batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
step_sleep = float(os.environ.get("STEP_SLEEP", "0.05"))
ctx = runtime.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
sampler = runtime.ElasticSampler(n, seed=1)
ckpt = runtime.Checkpointer()
state = {"step": 0}
if os.environ.get("DEEPPOD_JOINING") != "1":
    got = ckpt.load_latest(model=model, optimizer=opt, sampler=sampler)
    if got:
        state["step"] = got["step"]
resizer = runtime.Resizer(model, opt, sampler, state)
data = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4) / n
log = open(os.path.join(out, f"rank-{resizer.rank}.txt"), "a")
while not sampler.epoch_done:
    mine = sampler.rest()[:local_batch]
    opt.zero_grad()
    loss = model(data[mine]).pow(2).mean() if mine else model(data[:1]).sum() * 0
    loss.backward()
    if dist.is_initialized():
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= resizer.world_size
    opt.step()
    sampler.advance(local_batch)
    state["step"] += 1
    weights = round(float(sum(p.double().sum() for p in model.parameters())), 9)
    log.write(f"{state['step']} {resizer.world_size} {weights} {' '.join(map(str, mine))}\n")
    log.flush()
    time.sleep(step_sleep)
    event = resizer.check()
    if event == "resize":
        event = resizer.resize()
    if event == "stop":
        ckpt.save(state["step"], model=model, optimizer=opt, sampler=sampler)
        runtime.exit_for_resume()
log.write("done\n")
log.flush()
if dist.is_initialized():  # leave together: a peer that outlives rank 0's store aborts at exit
    dist.barrier()
    dist.destroy_process_group()
log.close()
sys.stdout.flush()
# Past here is only the interpreter's teardown, where torch's gloo store once aborted rank 0
# (SIGABRT, "terminate called without an active exception") after all of the above was done.
os._exit(0)

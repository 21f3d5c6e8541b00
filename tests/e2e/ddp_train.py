"""An ordinary torch.distributed DDP script: it knows nothing about DeepPod.

Each rank trains on different data; DDP all-reduces gradients, so the parameters must be
identical on every rank at the end. Each rank writes its final parameters for the test.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)  # reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights everywhere
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)  # different data on every rank
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for step in range(steps):
        x = torch.randn(32, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True) * (rank + 1)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    out = os.path.join(os.environ["OUT_DIR"], f"params-{rank}.json")
    with open(out, "w") as f:
        json.dump({"rank": rank, "world": world, "params": flat,
                   "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                          "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
                                                          "DEEPPOD_JOB_ID", "DEEPPOD_CHECKPOINT_DIR",
                                                          "DEEPPOD_API_URL", "DEEPPOD_TOKEN", "OMP_NUM_THREADS")},
                   "cwd": os.getcwd()}, f)
    dist.barrier()  # as torch's docs advise: no rank tears the group down while a peer still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

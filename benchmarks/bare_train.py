"""The baseline: the same training loop in bare PyTorch, launched by torchrun. No DeepPod."""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--model", default="resnet50")
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--image-size", type=int, default=224)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--warmup", type=int, default=3)
a = p.parse_args()
cuda = torch.cuda.is_available()
world = int(os.environ.get("WORLD_SIZE", 1))
if world > 1:
    dist.init_process_group("nccl" if cuda else "gloo")
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
model = torchvision.models.get_model(a.model, weights=None).to(device)
if cuda:
    model = model.to(memory_format=torch.channels_last)
ddp = DDP(model, device_ids=[device.index] if cuda else None) if world > 1 else model
opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
scaler = torch.amp.GradScaler("cuda", enabled=cuda)
x = torch.randn(a.batch_size, 3, a.image_size, a.image_size, device=device)
if cuda:
    x = x.to(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (a.batch_size,), device=device)


def step():
    with torch.autocast(device.type, enabled=cuda):
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


for _ in range(a.warmup):
    step()
if cuda:
    torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(a.steps):
    step()
if cuda:
    torch.cuda.synchronize()
dt = time.perf_counter() - t0
# one write: the ranks share torchrun's stdout, and print() writes the line and its end apart
sys.stdout.write("DEEPPOD-BENCH " + json.dumps({"rank": int(os.environ.get("RANK", 0)),
                                                "images_per_second": a.steps * a.batch_size / dt}) + "\n")
sys.stdout.flush()
if world > 1:
    dist.destroy_process_group()

"""One worker of ``deeppod bench train``: the training loop as a DeepPod job runs it
(runtime.init, DDP, runtime.report every step, should_stop polling, checkpoints), on
synthetic or folder data. Prints one JSON line with its measurements."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def main(argv=None) -> int:
    import torch
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP

    from deeppod import runtime
    from deeppod.runtime.metrics import Reporter

    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--forward-only", action="store_true")
    p.add_argument("--checkpoint", action="store_true", help="measure the cost of a checkpoint save")
    a = p.parse_args(argv)

    ctx = runtime.init()
    cuda = ctx.device.type == "cuda"
    model = torchvision.models.get_model(a.model, weights=None).to(ctx.device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    ddp = DDP(model, device_ids=[ctx.device.index] if cuda else None) if ctx.world_size > 1 else model
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    x = torch.randn(a.batch_size, 3, a.image_size, a.image_size, device=ctx.device)
    if cuda:
        x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch_size,), device=ctx.device)
    reporter = Reporter(enabled=ctx.rank == 0, tb_dir=tempfile.mkdtemp(prefix="deeppod-bench-tb-"))

    def step(i: int) -> None:
        with torch.autocast(ctx.device.type, enabled=cuda):
            if a.forward_only:
                with torch.no_grad():
                    ddp(x)
                return
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        reporter.report(i, loss=loss.detach())  # what a DeepPod job does every step
        runtime.should_stop(sync=False)

    for i in range(a.warmup):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(a.steps):
        step(a.warmup + i)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    out = {"rank": ctx.rank, "world": ctx.world_size, "images": a.steps * a.batch_size, "seconds": elapsed,
           "images_per_second": a.steps * a.batch_size / elapsed, "device": str(ctx.device)}
    if a.checkpoint and ctx.rank == 0:
        ck = runtime.Checkpointer(tempfile.mkdtemp(prefix="deeppod-bench-ckpt-"), keep=1, rank=0)
        t = time.perf_counter()
        ck.save(1, model=model, optimizer=opt, blocking=True)
        out["checkpoint_blocking_s"] = time.perf_counter() - t
        t = time.perf_counter()
        ck.save(2, model=model, optimizer=opt, blocking=False)
        out["checkpoint_background_stall_s"] = time.perf_counter() - t  # what the loop waits
        ck.wait()
        out["checkpoint_bytes"] = sum(f.stat().st_size for f in ck.checkpoints())
    reporter.close(timeout=2)
    print("DEEPPOD-BENCH " + json.dumps(out), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

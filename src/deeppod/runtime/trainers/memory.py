"""How much host memory one worker of the built-in trainer needs, before the job is submitted:
``deeppod train --memory`` picks the strategy from it (DDP where the whole model fits, else
sharded) and refuses, with the estimate, a job that would not fit even sharded.

The model is built on PyTorch's meta device (shapes, no storage: a second for any torchvision
model) and one forward pass on it gives every layer's output size, which is what a training
step keeps for its backward pass. The rest is counted per parameter (4 bytes each in fp32):

- DDP: the weights, their gradients, DDP's gradient buckets (a second copy of the gradients),
  the optimizer's state, and what the background checkpoint's copy adds (measured: about the
  weights' size).
- FSDP over N workers: 1/N of weights, gradients and optimizer state (a sharded checkpoint is
  written from the shards themselves); the whole weights and gradients of the largest block
  while it runs (and the next, prefetched); the root's own layers (stem, classifier) whole.
  At the end the chief holds the whole model once, for the artifact.
- Activation checkpointing keeps only each block's input, and one block's inside at a time.
- Every worker: the Python process with torch imported, and its data-loader workers.

The fixed parts were measured on this trainer (anonymous memory of its control group: ResNet-50
at 2 workers, Adam, 32 px, per-worker batch 8: DDP 1,144 MiB, FSDP 857 MiB, estimated 1,259
and 954); a margin covers the allocator's slack. The estimate is of a worker whose model is in host memory (a
CPU job, or offload on a GPU).

On a GPU (``device="gpu"``) the same parts are counted in GPU memory, with what differs there:
activations in bf16 (AMP, or the sharded model's mixed precision: half of fp32's bytes), no
checkpoint copy (it is taken to host memory), the CUDA context instead of the Python process,
and with offload only the gathered blocks and the activations. Checked against an H200
(docs/benchmarks.md, "Large models on one GPU"): 16 bytes a parameter under FSDP and AdamW, plus
the layer at work.
"""

from __future__ import annotations

from dataclasses import dataclass

MB = 1 << 20
BASE_MB = 400  # Python, torch and torchvision imported, the data index: a worker at rest (measured 375-400)
LOADER_WORKER_MB = 120  # each data-loader worker (measured: 2 add 235 MiB)
SLACK = 1.05  # the allocator's free pieces, the loader's batches in flight
CUDA_CONTEXT_MB = 600  # the CUDA context, cuDNN and cuBLAS workspaces: GPU memory outside PyTorch's allocator
GPU_SLACK = 1.10  # the caching allocator's fragmentation
OPTIMIZER_COPIES = {"sgd": 0, "momentum": 1, "nesterov": 1, "adam": 2, "adamw": 2, "adagrad": 1, "adadelta": 2,
                    "rmsprop": 1}


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a model: its parameter count, its largest repeated block's,
    the root's own (outside every block), and the activation bytes one sample keeps."""

    params: int
    largest_block: int
    root_own: int
    activations_per_sample: int  # every layer's output: what a training step keeps for backward
    block_inputs_per_sample: int  # each block's input only: what activation checkpointing keeps
    largest_block_activations: int  # per sample, the largest block's inside (recomputed one at a time)


@dataclass(frozen=True)
class Estimate:
    strategy: str
    activation_checkpointing: bool
    workers: int
    parts: dict  # MiB by part
    total_mb: int
    device: str = "host"  # or "gpu": the memory of each of the worker's GPUs
    offload: bool = False  # on a GPU: shards and optimizer state in host memory

    def text(self) -> str:
        ac = " with activation checkpointing" if self.activation_checkpointing else ""
        ac += (" and offload" if ac else " with offload") if self.offload else ""
        parts = ", ".join(f"{k} {v:,} MiB" for k, v in self.parts.items() if v)
        per = "per GPU" if self.device == "gpu" else "per worker"
        return f"{self.strategy}{ac} at {self.workers} workers: {self.total_mb:,} MiB {per} ({parts})"


def shape(model, image_size: int) -> Shape:
    """The model's :class:`Shape`, from a forward pass on the meta device (the
    model may be on the meta device: nothing is allocated)."""
    import torch

    from deeppod.runtime.sharding import find_blocks

    kinds = find_blocks(model)
    blocks = [m for m in model.modules() if kinds and isinstance(m, kinds)]
    outer = [b for b in blocks if not any(b is not o and any(b is s for s in o.modules()) for o in blocks)]
    in_blocks = {id(p) for b in outer for p in b.parameters()}
    sizes = {"all": 0, "inputs": 0, "inside": {}}

    def leaf(_module, _inputs, output):
        if isinstance(output, torch.Tensor):
            sizes["all"] += output.numel() * output.element_size()

    def block_in(module, inputs):
        sizes["inputs"] += sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
        sizes["inside"][id(module)] = sizes["all"]

    def block_out(module, _inputs, _output):
        sizes["inside"][id(module)] = sizes["all"] - sizes["inside"][id(module)]

    hooks = [m.register_forward_hook(leaf) for m in model.modules() if not list(m.children())]
    hooks += [b.register_forward_pre_hook(block_in) for b in outer] + [b.register_forward_hook(block_out)
                                                                       for b in outer]
    try:
        with torch.device("meta"):
            model.to("meta")(torch.zeros(2, 3, image_size, image_size))  # two: batch norm refuses one in training
    finally:
        for h in hooks:
            h.remove()
    return Shape(params=sum(p.numel() for p in model.parameters()),
                 largest_block=max((sum(p.numel() for p in b.parameters()) for b in outer), default=0),
                 root_own=sum(p.numel() for p in model.parameters() if id(p) not in in_blocks),
                 activations_per_sample=sizes["all"] // 2, block_inputs_per_sample=sizes["inputs"] // 2,
                 largest_block_activations=max(sizes["inside"].values(), default=0) // 2)


def estimate(s: Shape, *, strategy: str, workers: int, per_worker_batch: int, optimizer: str,
             loader_workers: int, activation_checkpointing: bool = False, device: str = "host",
             offload: bool = False, amp: bool = True) -> Estimate:
    """One worker's host memory (``device="host"``), or the memory of each of its GPUs
    (``"gpu"``: ``offload`` keeps shards and optimizer state in host memory, ``amp`` computes
    in bf16), for a model of shape ``s`` trained this way (MiB)."""
    gpu = device == "gpu"
    p, copies = 4 * s.params, OPTIMIZER_COPIES.get(optimizer, 2)
    if activation_checkpointing and s.block_inputs_per_sample:
        kept = s.block_inputs_per_sample + s.largest_block_activations
        acts = per_worker_batch * min(s.activations_per_sample, kept)
    else:
        acts = per_worker_batch * s.activations_per_sample
    if gpu and (amp or strategy == "fsdp"):
        acts //= 2  # bf16: AMP, or the sharded model's mixed precision
    if strategy == "ddp":
        parts = {"weights": p, "gradients": p, "DDP buckets": p if workers > 1 else 0, "optimizer": copies * p,
                 "checkpoint copy": 0 if gpu else p}  # a GPU's checkpoint is copied to host memory
    else:
        n = max(1, workers)
        working = 4 * (2 * s.largest_block + s.root_own)  # gathered: the block at work, the next, the root's own
        parts = {"weight shards": p // n, "gradient shards": p // n, "optimizer": copies * p // n}
        if gpu and offload:
            parts = {}  # in host memory: the GPU holds what is gathered for the step
        parts["gathered blocks"] = working + 4 * s.largest_block
    parts["activations"] = acts
    parts = {k: round(v / MB) for k, v in parts.items()}
    if gpu:
        parts["CUDA context"] = CUDA_CONTEXT_MB
        return Estimate(strategy, activation_checkpointing, workers, parts, round(sum(parts.values()) * GPU_SLACK),
                        device, offload and strategy == "fsdp")
    parts["process"] = BASE_MB + LOADER_WORKER_MB * loader_workers
    total = round(sum(parts.values()) * SLACK)
    if strategy == "fsdp":  # the end: the whole model on the chief for the artifact, beside its shards
        total = max(total, round((parts["process"] + 4 * s.params / MB + parts["weight shards"]) * SLACK))
    return Estimate(strategy, activation_checkpointing, workers, parts, total)


def choose(s: Shape, memory_mb: int, *, strategy: str | None, activation_checkpointing: bool | None,
           offload: bool | None = False, **how) -> Estimate:
    """The first way that fits ``memory_mb``, in order of cost: DDP, sharded, sharded with
    activation checkpointing, and on a GPU the same two offloaded (only those the caller left
    open: None leaves a choice open). ValueError with every estimate when none fits."""
    gpu = how.get("device") == "gpu"
    ways = [(st, ac, off) for off in (False, True) for st in ("ddp", "fsdp") for ac in (False, True)
            if strategy in (None, st) and activation_checkpointing in (None, ac) and offload in (None, off)
            and not (st == "ddp" and (ac or off)) and not (off and not gpu)]
    tried = [estimate(s, strategy=st, activation_checkpointing=ac, offload=off, **how) for st, ac, off in ways]
    for e in tried:
        if e.total_mb <= memory_mb:
            return e
    raise ValueError("; ".join(e.text() for e in tried))



def plan(args: list[str], memory_mb: int | None, workers: int, device: str = "host") -> tuple[list[str], Estimate]:
    """The trainer's options for a job of ``workers`` workers with ``memory_mb`` each (host
    memory, or with ``device="gpu"`` each GPU's; None: not known, the cheapest way is taken):
    ``args`` with the strategy (and activation checkpointing) that fits, unless they name one,
    and the estimate. The model, image size, batch and optimizer are read from ``args`` as the
    trainer reads them ('auto' as on that device). InvalidRequest, with the estimates, when
    nothing fits."""
    from deeppod.errors import InvalidRequest
    from deeppod.runtime.trainers import image_classifier as trainer

    try:
        return _plan(trainer.parse_args(args), args, memory_mb, workers, device)
    except SystemExit as exc:  # what the trainer would say about these images at its start
        raise InvalidRequest(str(exc.code)) from None


def gpu_request(args: list[str], workers: int, *, largest_mb: int | None, asked_mb: int | None
                ) -> tuple[list[str], Estimate | None, int | None]:
    """``args`` with the way that fits ``asked_mb`` (per GPU) or the cluster's ``largest_mb``, its
    estimate, and the job's memory ask; nothing estimated where neither is known.
    InvalidRequest, with every estimate, when nothing fits."""
    if not (asked_mb or largest_mb):
        return args, None, asked_mb
    args, e = plan(args, asked_mb or largest_mb, workers, device="gpu")
    return args, e, asked_mb or e.total_mb


def _plan(a, args: list[str], memory_mb: int | None, workers: int, device: str) -> tuple[list[str], Estimate]:
    from pathlib import Path

    import torch

    from deeppod.errors import InvalidRequest
    from deeppod.runtime.trainers import image_classifier as trainer

    gpu = device == "gpu"
    model = ("resnet18" if gpu else trainer.SMALL_CNN) if a.model == trainer.AUTO else a.model
    # a class-per-folder tree (not a dataset version, as the trainer tells them): its own classes and sizes
    items = trainer.scan(Path(a.data)) if a.data and trainer.dataset_dir(a) is None else None
    size, assumed = a.image_size, ""
    if not size and items is not None:
        size = trainer.native_size(trainer.folder_sizes(items[1]))
    elif not size:
        size, assumed = trainer.MAX_SIZE, f" (images taken as {trainer.MAX_SIZE} px: --image-size to say)"
    with torch.device("meta"):
        s = shape(trainer.build_model(model, len(items[0]) if items else 1000), size)
    fixed = "--strategy" in args
    try:
        chosen = choose(s, memory_mb if memory_mb is not None else 1 << 40,
                        strategy=a.strategy if fixed else None,
                        activation_checkpointing=True if a.activation_checkpointing else None, workers=workers,
                        per_worker_batch=max(1, -(-(a.batch_size or trainer.DEFAULT_BATCH)
                                                  // (a.base_workers or workers))),
                        optimizer=a.optimizer, loader_workers=a.loader_workers, device=device,
                        offload=(True if a.offload else None) if gpu else False, amp=a.amp != "off")
    except ValueError as exc:
        more = ("GPUs with more memory (--gpu-memory), more workers (-n) to shard over (--strategy fsdp, which "
                "may also --offload to host memory)" if gpu
                else "more memory (--memory), more workers (-n) to shard over")
        raise InvalidRequest(f"{model} does not fit in {memory_mb:,} MiB per {'GPU' if gpu else 'worker'}{assumed}: "
                             f"{exc}. Ask for {more}, a smaller --batch-size or --image-size, or a lighter "
                             "--optimizer") from None
    extra = [] if fixed else ["--strategy", chosen.strategy]
    if chosen.activation_checkpointing and not a.activation_checkpointing:
        extra.append("--activation-checkpointing")
    if chosen.offload and not a.offload:
        extra.append("--offload")
    return [*args, *extra], chosen

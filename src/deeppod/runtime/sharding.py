"""``runtime.shard(model)``: fully sharded data parallel (PyTorch FSDP2, ``fully_shard``), for
models whose parameters, gradients and optimizer state do not fit one worker.

Each worker keeps 1/N of every parameter, its gradient and its optimizer state; a block's
full weights exist only while that block runs (gathered before, freed after). Blocks are the
model's repeated modules, found by :func:`find_blocks` (a ResNet's bottlenecks, a
transformer's layers) or named by the caller; the root is sharded last, taking what is left.
DDP stays the default: a script opts in with one call after ``runtime.init()``::

    ctx = runtime.init()
    model = runtime.shard(build_model())            # instead of DDP(model)
    opt = torch.optim.AdamW(model.parameters())     # made after shard(): on the shards
    ckpt.load_latest(model=model, optimizer=opt)    # sharded checkpoints, any world size

On GPU (NCCL) the parameters compute in bf16 and gradients reduce in fp32 unless
``mixed_precision=False``; ``offload=True`` keeps the shards and the optimizer's state in
host memory (the GPU holds only the block at work); ``activation_checkpointing=True``
recomputes each block's activations in the backward pass instead of keeping them. On CPU
(gloo) the same code runs in fp32; offload means nothing there and is ignored.
"""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger(__name__)

_CONTAINERS = ("ModuleList", "Sequential", "ModuleDict")


def find_blocks(model) -> tuple[type, ...]:
    """The classes of the model's outermost repeated blocks: module classes with parameters
    that occur at least twice, are not containers or single layers (no submodules), and are
    not inside another such block. Empty: nothing repeats (the root alone is sharded)."""
    import torch.nn as nn

    counts = Counter(type(m) for m in model.modules() if m is not model)
    candidates = {cls for cls, n in counts.items()
                  if n >= 2 and cls.__name__ not in _CONTAINERS and issubclass(cls, nn.Module)}
    candidates = {cls for cls in candidates
                  if any(len(list(m.children())) > 0 and any(True for _ in m.parameters())
                         for m in model.modules() if type(m) is cls)}
    if not candidates:
        return ()
    chosen: set[type] = set()

    def walk(module, inside: bool) -> None:
        for child in module.children():
            hit = type(child) in candidates
            if hit and not inside:
                chosen.add(type(child))
            walk(child, inside or hit)

    walk(model, False)
    return tuple(sorted(chosen, key=lambda c: c.__name__))


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_FROM_BYTES = 128 * 1024


def _return_freed_memory() -> None:
    """On CPU, a sharded step allocates and frees a block's gathered weights and gradients
    every step, in sizes the heap cannot reuse well: glibc keeps the freed pieces and the
    worker's memory grows step after step (measured: 1.0 to 1.4 GB over three steps of a 43M
    parameter model at 2 workers). Allocations of 128 KiB and more are mapped on their own
    and given back when freed, as the CUDA caching allocator does on a GPU."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_FROM_BYTES)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def is_sharded(model) -> bool:
    """Whether ``model`` holds DTensor shards (FSDP2) rather than whole tensors. Imports nothing:
    if no code loaded DTensor, nothing is sharded (every checkpoint save asks)."""
    import sys

    tensor = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(tensor, "DTensor", None)
    return dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters())


def shard(model, *, blocks: tuple[type, ...] | list[type] | None = None, mixed_precision: bool | None = None,
          offload: bool = False, activation_checkpointing: bool = False, reshard_after_forward: bool = True):
    """Shard ``model`` over the job's workers in place and return it (see the module's text).
    Call after :func:`deeppod.runtime.init`, before making the optimizer."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("runtime.shard() needs the job's process group: call runtime.init() first "
                           "(a single process can run it too: WORLD_SIZE=1)")
    cuda = dist.get_backend() == "nccl" and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    kinds = tuple(blocks) if blocks is not None else find_blocks(model)
    if offload and not cuda:
        log.info("runtime.shard: offload ignored on CPU (the shards are in host memory already)")
        offload = False
    if not cuda:
        _return_freed_memory()
    if not offload:
        model.to(device)
    if activation_checkpointing and kinds:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, kinds))
    options: dict = {"mesh": init_device_mesh(device.type, (dist.get_world_size(),)),
                     "reshard_after_forward": reshard_after_forward}
    if mixed_precision if mixed_precision is not None else cuda:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if offload:
        options["offload_policy"] = CPUOffloadPolicy()
    wrapped = 0
    insides = {id(m._checkpoint_wrapped_module) for m in model.modules() if hasattr(m, "_checkpoint_wrapped_module")}
    for module in list(model.modules()):
        # a block under activation checkpointing sits in a wrapper: the wrapper is what is sharded
        inner = getattr(module, "_checkpoint_wrapped_module", None)
        if module is not model and (isinstance(inner, kinds) if inner is not None else
                                    isinstance(module, kinds) and id(module) not in insides):
            fully_shard(module, **options)
            wrapped += 1
    fully_shard(model, **options)
    log.info("runtime.shard: %d blocks (%s) and the root over %d workers on %s%s%s", wrapped,
             ", ".join(k.__name__ for k in kinds) or "none found", dist.get_world_size(), device.type,
             ", offloaded" if offload else "", ", activation checkpointing" if activation_checkpointing else "")
    return model

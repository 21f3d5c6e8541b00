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

A model too large to build whole in one worker's memory is built on PyTorch's meta device
(shapes, no storage) and ``shard`` materializes it a block at a time, each block sharded as
soon as it is initialized, so a worker never holds more than one block whole::

    with torch.device("meta"):
        model = build_model()
    model = runtime.shard(model)                    # init=fn: your own initialization

Every worker initializes each block from the same seed (rank 0's), so the shards are pieces
of one model. The initialization is the modules' own ``reset_parameters()`` (post-order, as
the constructors ran) unless ``init`` is given: it is called with every module that holds
parameters or buffers, as ``model.apply(fn)`` would be. A tensor nothing initialized is an
error that names it (a module that computes a buffer in its constructor needs ``init``).

On GPU (NCCL) the parameters compute in bf16 and gradients reduce in fp32 unless
``mixed_precision=False``; ``offload=True`` keeps the shards and the optimizer's state in
host memory (the GPU holds only the block at work); ``activation_checkpointing=True``
recomputes each block's activations in the backward pass instead of keeping them. On CPU
(gloo) the same code runs in fp32; offload means nothing there and is ignored.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable

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

    try:  # the process's own symbols (its C library's); find_library would start ldconfig
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_FROM_BYTES)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def is_sharded(model) -> bool:
    """Whether ``model`` holds DTensor shards (FSDP2) rather than whole tensors. Imports nothing:
    if no code loaded DTensor, nothing is sharded (every checkpoint save asks)."""
    import sys

    tensor = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(tensor, "DTensor", None)
    return dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters())


def _default_init(module) -> None:
    reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
    if callable(reset):
        reset()


def _own_tensors(module):
    yield from module.named_parameters(recurse=False)
    yield from module.named_buffers(recurse=False)


class _Materializer:
    """Turns meta-device modules into real ones on ``device``, initialized by ``init`` from one
    seed every worker shares. Each tensor is filled with NaN first, so one that ``init`` left
    alone is found and named instead of training on whatever memory held."""

    def __init__(self, model, device, init: Callable | None):
        import torch
        import torch.distributed as dist

        self.model, self.device, self.init = model, device, init or _default_init
        self.names = {id(m): n for n, m in model.named_modules()}
        seed = [int(torch.randint(0, 2**62, ()).item()) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(seed, src=0)  # the ranks' own seeds may differ: shards of one model
        self.seed = seed[0]

    @contextlib.contextmanager
    def seeded(self):
        import torch

        with torch.random.fork_rng(devices=[self.device.index] if self.device.type == "cuda" else []):
            torch.manual_seed(self.seed)
            yield

    def materialize(self, module) -> None:
        """What of ``module`` is still on the meta device (a block, just before it is sharded;
        the root, last: what the blocks left)."""
        import torch

        modules = [m for m in _post_order(module) if any(t.is_meta for _, t in _own_tensors(m))]
        for m in modules:
            m.to_empty(device=self.device, recurse=False)
            for _, t in _own_tensors(m):
                with torch.no_grad():
                    t.fill_(float("nan") if t.is_floating_point() else 0)
        for m in modules:
            self.init(m)
        for m in modules:
            for name, t in _own_tensors(m):
                if t.is_floating_point() and bool(torch.isnan(t).any()):
                    where = ".".join(x for x in (self.names.get(id(m), "?"), name) if x)
                    raise RuntimeError(
                        f"runtime.shard: {where} ({type(m).__name__}) was built on the meta device and nothing "
                        f"initialized it (no reset_parameters(), or init= left it): pass init=fn to runtime.shard, "
                        f"an fn that does, called with each module as model.apply(fn) would be")


def _post_order(module):
    for child in module.children():
        yield from _post_order(child)
    yield module


def _norms_in_fp32(options: dict, fully_shard, policy) -> Callable:
    """Under bf16 mixed precision, a function that shards each batch norm of a module (not
    yet sharded) on its own with fp32 weights: its running statistics are fp32 buffers, which
    batch norm refuses beside bf16 weights; with fp32 weights it takes the bf16 activations as
    autocast gives them. FSDP1's mixed precision leaves batch norm out the same way."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    mp = options.get("mp_policy")
    if mp is None or mp.param_dtype in (None, torch.float32):
        return lambda module: None
    fp32 = options | {"mp_policy": policy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                          cast_forward_inputs=False)}
    done: set[int] = set()

    def shard_norms(module) -> None:
        for m in module.modules():
            if isinstance(m, _BatchNorm) and id(m) not in done and any(True for _ in m.parameters()):
                fully_shard(m, **fp32)
                done.add(id(m))

    return shard_norms


def _join_alone() -> None:
    """A job of one worker has no process group (``runtime.init`` makes one only for two or
    more), yet sharding is what lets it offload to host memory: one is made for it here, in
    process. A worker of a larger job must have joined its group first."""
    import torch
    import torch.distributed as dist

    from deeppod.runtime.context import job_context

    if job_context().world_size != 1:
        raise RuntimeError("runtime.shard() needs the job's process group: call runtime.init() first")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)


def shard(model, *, blocks: tuple[type, ...] | list[type] | None = None, mixed_precision: bool | None = None,
          offload: bool = False, activation_checkpointing: bool = False, reshard_after_forward: bool = True,
          init: Callable | None = None):
    """Shard ``model`` over the job's workers in place and return it (see the module's text).
    Call after :func:`deeppod.runtime.init`, before making the optimizer. A model on the meta
    device is materialized a block at a time (``init``: how; the modules' own by default)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if not (dist.is_available() and dist.is_initialized()):
        _join_alone()
    cuda = dist.get_backend() == "nccl" and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    kinds = tuple(blocks) if blocks is not None else find_blocks(model)
    if offload and not cuda:
        log.info("runtime.shard: offload ignored on CPU (the shards are in host memory already)")
        offload = False
    if not cuda:
        _return_freed_memory()
    on_meta = [t.is_meta for t in [*model.parameters(), *model.buffers()]]
    meta = any(on_meta)
    if meta and not all(on_meta):
        raise RuntimeError("runtime.shard: the model is partly on the meta device: build all of it under "
                           "torch.device('meta') (shard() materializes it), or none of it")
    if not offload and not meta:
        model.to(device)
    # offloaded too, a block is initialized on the GPU (its random generator is many times the
    # host's, which fills one number at a time) and fully_shard moves its shards to host memory
    make = _Materializer(model, device, init) if meta else None
    if activation_checkpointing and kinds:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, kinds))
    options: dict = {"mesh": init_device_mesh(device.type, (dist.get_world_size(),)),
                     "reshard_after_forward": reshard_after_forward}
    if mixed_precision if mixed_precision is not None else cuda:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if offload:
        options["offload_policy"] = CPUOffloadPolicy()
    norms = _norms_in_fp32(options, fully_shard, MixedPrecisionPolicy)
    wrapped = 0
    insides = {id(m._checkpoint_wrapped_module) for m in model.modules() if hasattr(m, "_checkpoint_wrapped_module")}
    with make.seeded() if make else contextlib.nullcontext():
        for module in list(model.modules()):
            # a block under activation checkpointing sits in a wrapper: the wrapper is what is sharded
            inner = getattr(module, "_checkpoint_wrapped_module", None)
            if module is not model and (isinstance(inner, kinds) if inner is not None else
                                        isinstance(module, kinds) and id(module) not in insides):
                if make:
                    make.materialize(module)
                norms(module)
                fully_shard(module, **options)
                wrapped += 1
        if make:
            make.materialize(model)
    norms(model)
    fully_shard(model, **options)
    log.info("runtime.shard: %d blocks (%s) and the root over %d workers on %s%s%s%s", wrapped,
             ", ".join(k.__name__ for k in kinds) or "none found", dist.get_world_size(), device.type,
             ", offloaded" if offload else "", ", activation checkpointing" if activation_checkpointing else "",
             ", materialized from the meta device a block at a time" if meta else "")
    return model

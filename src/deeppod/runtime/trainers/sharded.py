"""What the built-in trainer does differently when its model is sharded (``--strategy fsdp``):
every forward pass gathers a block's weights from all workers, so all of them must run the
same number of passes, and the artifact needs the whole model back on one worker."""

from __future__ import annotations


def _device():
    import torch
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def most(n: int) -> int:
    """The largest ``n`` across the workers (a collective: every worker calls it)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([n], dtype=torch.int64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def empty_step(model, optimizer, image_size: int, device) -> None:
    """A training step with no samples: a forward and backward pass whose gradient is zero and
    the optimizer's step, so this worker meets the others' all-gathers and reduce-scatters.
    In eval mode: batch norm's running statistics do not see the stand-in image."""
    import torch

    model.eval()
    try:
        optimizer.zero_grad(set_to_none=True)
        out = model(torch.zeros(1, 3, image_size, image_size, device=device))
        (out.float().sum() * 0).backward()
        optimizer.step()
    finally:
        model.train()


def whole(model, build):
    """The whole model on the chief (rank 0), made by ``build()`` and given every worker's
    shards; None on the others. Every worker must call it."""
    import gc

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model.zero_grad(set_to_none=True)
    gc.collect()  # the optimizer's state and the gradients go before the whole weights come
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return None
    with torch.device("meta"):
        fresh = build()  # shapes only: the gathered tensors become its weights, not a copy of them
    fresh.load_state_dict(state, assign=True)
    return fresh

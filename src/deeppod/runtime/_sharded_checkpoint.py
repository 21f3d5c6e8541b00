"""Checkpoints of sharded models (runtime.shard): ``torch.distributed.checkpoint`` folders that
every worker writes its shards into and that load at any number of workers (DCP reshards:
each loader reads the byte ranges its own shards need). Called by runtime.checkpoint."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from deeppod.atomic import fsync_dir

log = logging.getLogger(__name__)
SHARDED_META = "deeppod.pt"  # in a sharded checkpoint's folder: step, epoch, sampler, RNG, extra


def _state(model, optimizer) -> dict:
    """The model's (and optimizer's) state as DCP saves and loads it: keyed by parameter name,
    each tensor as this worker holds it (a shard, or whole for a model that is not sharded)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer if optimizer is not None else [])
    return {"model": msd, **({"optimizer": osd} if optimizer is not None else {})}


def save(ckpt, step: int, *, model, optimizer, rest: dict, epoch: int, extra: dict | None,
         background: bool = False) -> Path | None:
    """Every worker: its shards into a folder beside the others', renamed into place by rank 0
    once all have written (a crash mid-way leaves a hidden folder the next save replaces).

    ``background``: each worker copies its shards to host memory and returns; a thread writes
    them (over a process group of the checkpoint's own, so the training's collectives never
    interleave with the save's). The folder is renamed into place by the next save or
    ``ckpt.wait()``, which every worker calls before it exits and which returns on no worker
    before the folder is in place."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from deeppod.runtime.rng import rng_state

    ckpt.wait()
    final = ckpt.dir / f"ckpt-{step:012d}.dcp"
    tmp = ckpt.dir / f".ckpt-{step:012d}.dcp.tmp"
    if ckpt.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    # what rank 0 keeps beside the shards is taken now, at this step, not when the write ends
    meta = {"step": step, "epoch": epoch, "rng": rng_state(), "extra": extra or {}, "world_size":
            dist.get_world_size(), **{k: v.state_dict() for k, v in rest.items() if v is not None}} \
        if ckpt.rank == 0 else None
    if background:
        future = dcp.async_save(_state(model, optimizer), checkpoint_id=str(tmp), process_group=_group(ckpt))
        ckpt.pending(lambda: _settle(ckpt, future, tmp, final, meta))
        return final if ckpt.rank == 0 else None
    dcp.save(_state(model, optimizer), checkpoint_id=str(tmp))  # writes, then a barrier-like gather
    _finish(ckpt, tmp, final, meta)
    dist.barrier()  # no worker goes on (or exits) before the folder is in place
    return final if ckpt.rank == 0 else None


def _group(ckpt):
    """The background saves' own gloo group, made by every worker at its first background
    save (every worker saves at the same step, so they make it together)."""
    import torch.distributed as dist

    if ckpt.dcp_group is None:
        ckpt.dcp_group = dist.new_group(backend="gloo")
    return ckpt.dcp_group


def _settle(ckpt, future, tmp: Path, final: Path, meta: dict | None) -> None:
    """Every worker, in ``wait()``: its shards written, rank 0 puts the folder in place, and no
    worker goes on before it is (a worker that went on would load the step before it, or none,
    while the others load this one: the loads' collectives would not match)."""
    import torch.distributed as dist

    try:
        future.result()
        _finish(ckpt, tmp, final, meta)
    finally:
        dist.barrier()  # reached by every worker, failed or not, so none is left waiting


def _finish(ckpt, tmp: Path, final: Path, meta: dict | None) -> None:
    """Rank 0, once every worker's shards are written: the step's record beside them, the
    folder renamed into place, the oldest pruned."""
    import torch

    if ckpt.rank != 0:
        return
    torch.save(meta, tmp / SHARDED_META)
    fsync_dir(tmp)
    shutil.rmtree(final, ignore_errors=True)  # the same step saved again (a stop right after a save)
    os.rename(tmp, final)
    fsync_dir(ckpt.dir)
    ckpt.prune()
    log.debug("sharded checkpoint %s written", final)


def meta(path: Path) -> dict:
    """What rank 0 saved beside the shards: step, epoch, sampler, RNG, extra."""
    import torch

    return torch.load(path / SHARDED_META, map_location="cpu", weights_only=False)


def load_into(path: Path, model, optimizer) -> None:
    """The model's and optimizer's state from ``path`` into them, as this worker holds them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    if model is None:
        return
    state = _state(model, optimizer)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer if optimizer is not None else [], model_state_dict=state["model"],
                   optim_state_dict=state.get("optimizer") or {})


def load_whole(state: dict, model, optimizer) -> None:
    """A single-file checkpoint (a whole model's, as DDP or one process saved it) into a
    sharded model: each worker keeps its shards of it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    if "model" in state:
        set_model_state_dict(model, state["model"], options=options)
    if optimizer is not None and "optimizer" in state:
        set_optimizer_state_dict(model, optimizer, by_name(state["optimizer"], model), options=options)


def by_name(osd: dict, model) -> dict:
    """A plain ``optimizer.state_dict()`` (parameters by position) keyed by parameter name, as
    the distributed state-dict functions take it. Positions follow ``model.parameters()``, the
    order an optimizer made as ``Optim(model.parameters())`` holds them."""
    names = [name for name, _ in model.named_parameters()]
    if not osd.get("param_groups") or not all(isinstance(i, int) for g in osd["param_groups"] for i in g["params"]):
        return osd  # by name already
    return {"state": {names[i]: s for i, s in osd.get("state", {}).items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]}

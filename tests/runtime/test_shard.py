"""runtime.shard (FSDP2 on gloo, real processes): the same loss curve as DDP, and sharded
checkpoints that load at another number of workers, or into a whole model."""

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

from deeppod.runtime.sharding import find_blocks

STEPS = 20


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), *[Block(16) for _ in range(4)], torch.nn.Linear(16, 3))


def batch(step, rank, world):
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(12, 8, generator=g), torch.randn(12, 3, generator=g)
    return x[rank::world], y[rank::world]  # 12 samples a step, split evenly over 2 or 3 workers


def _step(model, opt, step, rank, world):
    """One AdamW step on this worker's share of ``batch(step)``; its loss."""
    x, y = batch(step, rank, world)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def _init(folder, rank, world, name):
    """Over TCP, as jobs meet (rank 0 holds the store); the port is in the folder, per group."""
    import torch.distributed as dist

    port = json.loads((Path(folder) / "ports.json").read_text())[name]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def full_state(model, opt):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not msd:  # gathered on rank 0 only
        return {}, {}
    return {k: v.clone() for k, v in msd.items()}, {k: v["exp_avg"].clone() for k, v in osd["state"].items()}


def _train(rank, world, folder, strategy):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from deeppod.runtime import Checkpointer
    from deeppod.runtime.sharding import is_sharded, shard

    _init(folder, rank, world, f"rdv-{strategy}")
    torch.set_num_threads(1)
    model = build()
    if strategy == "ddp":
        model = DistributedDataParallel(model)
    else:  # fsdp-ac: the blocks recompute their activations in the backward pass
        model = shard(model, activation_checkpointing=strategy == "fsdp-ac")
    assert is_sharded(model) == (strategy != "ddp")
    assert any(hasattr(m, "_checkpoint_wrapped_module") for m in model.modules()) == (strategy == "fsdp-ac")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        mean = _step(model, opt, step, rank, world).clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    Checkpointer(f"{folder}/ckpt-{strategy}", rank=rank).save(STEPS, model=model, optimizer=opt, epoch=1,
                                                             extra={"by": strategy})
    target = model.module if strategy == "ddp" else model
    weights, moments = full_state(target, opt)
    if rank == 0:
        torch.save({"weights": weights, "moments": moments}, f"{folder}/ref-{strategy}.pt")
        with open(f"{folder}/losses-{strategy}.json", "w") as f:
            json.dump(losses, f)
    dist.barrier()  # no worker tears down its connections while another still reads from them
    dist.destroy_process_group()
    _leave()


def _leave() -> None:
    """Exit now: what remains is the interpreter's teardown, where torch's gloo store aborted
    rank 0 once in CI (SIGABRT, "terminate called without an active exception") after the
    worker had done and written everything the test checks."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _resume(rank, world, folder):
    """At 3 workers: the sharded checkpoint written by 2, and DDP's single file, each into a
    sharded model, equal to what was saved."""
    import torch.distributed as dist

    from deeppod.runtime import Checkpointer
    from deeppod.runtime.sharding import shard

    _init(folder, rank, world, "rdv-resume")
    torch.set_num_threads(1)
    verdicts = {}
    for strategy in ("fsdp", "ddp"):
        model = shard(build())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        got = Checkpointer(f"{folder}/ckpt-{strategy}", rank=rank).load_latest(model=model, optimizer=opt)
        ref = torch.load(f"{folder}/ref-{strategy}.pt")
        weights, moments = full_state(model, opt)
        verdicts[strategy] = (got["step"] == STEPS and got["epoch"] == 1 and got["extra"] == {"by": strategy}
                              and set(weights) == set(ref["weights"])
                              and all(torch.allclose(weights[k], v) for k, v in ref["weights"].items())
                              and all(torch.allclose(moments[k], v) for k, v in ref["moments"].items()))
    if rank == 0:
        with open(f"{folder}/resume.json", "w") as f:
            json.dump(verdicts, f)
    dist.barrier()  # no worker tears down its connections while another still reads from them
    dist.destroy_process_group()
    _leave()


def test_blocks_are_the_outermost_repeated_modules():
    import torchvision

    assert find_blocks(build()) == (Block,)
    assert [c.__name__ for c in find_blocks(torchvision.models.resnet18())] == ["BasicBlock"]
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32)
    assert find_blocks(torch.nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)) == \
        (torch.nn.TransformerEncoderLayer,)
    assert find_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))) == ()  # layers alone


@pytest.mark.slow  # it starts processes
def test_fsdp_follows_ddps_loss_and_its_checkpoint_resumes_at_another_size(tmp_path):
    from deeppod.contract import free_port

    names = ["rdv-ddp", "rdv-fsdp", "rdv-fsdp-ac", "rdv-resume"]
    (tmp_path / "ports.json").write_text(json.dumps({n: free_port() for n in names}))
    for strategy in ("ddp", "fsdp", "fsdp-ac"):
        mp.start_processes(_train, args=(2, str(tmp_path), strategy), nprocs=2, start_method="spawn")
    ddp, fsdp, fsdp_ac = (json.loads((tmp_path / f"losses-{s}.json").read_text()) for s in ("ddp", "fsdp", "fsdp-ac"))
    assert len(ddp) == len(fsdp) == STEPS and ddp[-1] < 0.8 * ddp[0]  # it learns
    assert fsdp == pytest.approx(ddp, rel=1e-4, abs=1e-6)
    assert fsdp_ac == pytest.approx(ddp, rel=1e-4, abs=1e-6)
    saved = sorted(p.name for p in (tmp_path / "ckpt-fsdp").iterdir())
    assert saved == [f"ckpt-{STEPS:012d}.dcp"]  # a folder, renamed into place; nothing half-written beside it
    assert len(list((tmp_path / "ckpt-fsdp" / saved[0]).glob("*.distcp"))) == 2  # one file per worker

    mp.start_processes(_resume, args=(3, str(tmp_path)), nprocs=3, start_method="spawn")
    assert json.loads((tmp_path / "resume.json").read_text()) == {"fsdp": True, "ddp": True}

    # one process, a whole model: the sharded checkpoint loads into it
    from deeppod.runtime import Checkpointer

    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    got = Checkpointer(tmp_path / "ckpt-fsdp", rank=0).load_latest(model=model, optimizer=opt)
    ref = torch.load(tmp_path / "ref-fsdp.pt")
    assert got["step"] == STEPS
    for name, p in model.named_parameters():
        assert torch.allclose(p.detach(), ref["weights"][name])
        assert torch.allclose(opt.state[p]["exp_avg"], ref["moments"][name])


class Net(torch.nn.Module):
    """Transformer layers (attention initializes itself with _reset_parameters, not the public
    name) between two linear layers."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 3)
        self.layers = torch.nn.ModuleList(torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
                                          for _ in range(2))

    def forward(self, x):
        h = self.embed(x).unsqueeze(1)
        for layer in self.layers:
            h = layer(h)
        return self.head(h.squeeze(1))


class Raw(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(4))

    def forward(self, x):
        return x * self.w.sum()


def _meta(rank, world, folder):
    """A model built on the meta device, materialized and sharded a block at a time; each rank
    seeded differently, as nothing makes a user's ranks agree."""
    import torch.distributed as dist

    from deeppod.runtime.sharding import shard

    _init(folder, rank, world, f"rdv-meta-{world}")
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    with torch.device("meta"):
        model = Net()
    model = shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    weights, _ = full_state(model, opt)
    losses = [_step(model, opt, step, rank, world).item() for step in range(STEPS)]
    refused = ""
    with torch.device("meta"):
        raw = torch.nn.Sequential(torch.nn.Linear(4, 4), Raw())
    try:
        shard(raw)
    except RuntimeError as exc:
        refused = str(exc)
    with torch.device("meta"):
        partly = torch.nn.Sequential(torch.nn.Linear(4, 4))
    partly.append(torch.nn.Linear(4, 4))  # built whole, beside a meta one
    try:
        shard(partly)
    except RuntimeError as exc:
        refused += "\n" + str(exc)
    if rank == 0:
        torch.save({"weights": weights, "losses": losses, "refused": refused}, f"{folder}/meta-{world}.pt")
    dist.barrier()
    dist.destroy_process_group()
    _leave()


@pytest.mark.slow  # it starts processes
def test_a_model_built_on_the_meta_device_is_materialized_block_by_block_as_one_model(tmp_path):
    from deeppod.contract import free_port

    (tmp_path / "ports.json").write_text(json.dumps({f"rdv-meta-{w}": free_port() for w in (1, 2)}))
    for world in (1, 2):
        mp.start_processes(_meta, args=(world, str(tmp_path)), nprocs=world, start_method="spawn")
    one, two = (torch.load(tmp_path / f"meta-{w}.pt") for w in (1, 2))
    assert set(one["weights"]) == {n for n, _ in Net().named_parameters()}
    for name, w in one["weights"].items():
        assert torch.isfinite(w).all(), name
        # two ranks seeded differently make the same model as one process: rank 0's seed for all
        assert torch.equal(w, two["weights"][name]), name
    assert one["weights"]["layers.0.self_attn.in_proj_bias"].abs().sum() == 0  # attention's own init ran
    assert one["weights"]["layers.1.norm1.weight"].eq(1).all()
    assert one["losses"][-1] < one["losses"][0] and two["losses"][-1] < two["losses"][0]
    assert "1.w (Raw) was built on the meta device and nothing initialized it" in one["refused"]
    assert "pass init=fn" in two["refused"]
    assert "the model is partly on the meta device" in one["refused"]


def _background(rank, world, folder):
    """A background sharded save: each worker copies its shards and trains on; what lands on
    disk is the state at the save's step, put in place by wait() before any worker goes on.
    Rank 0's rename is slowed, so a worker that did not wait for it would find nothing."""
    import time

    import torch.distributed as dist

    from deeppod.runtime import Checkpointer
    from deeppod.runtime import _sharded_checkpoint as sharded
    from deeppod.runtime.sharding import shard

    if rank == 0:
        rename = os.rename
        sharded.os = SimpleNamespace(rename=lambda a, b: (time.sleep(1), rename(a, b)))
    _init(folder, rank, world, "rdv-background")
    torch.set_num_threads(1)
    model = shard(build())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ckpt = Checkpointer(f"{folder}/ckpt-bg", rank=rank, background=True)
    for step in range(6):
        _step(model, opt, step, rank, world)
        if step == 2:
            saved = full_state(model, opt)
            ckpt.save(3, model=model, optimizer=opt, epoch=0, extra={"at": 3})
            hidden = sorted(p.name for p in Path(folder, "ckpt-bg").iterdir())
    ckpt.wait()
    shown = sorted(p.name for p in Path(folder, "ckpt-bg").iterdir())  # on every worker
    fresh = shard(build())
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    got = Checkpointer(f"{folder}/ckpt-bg", rank=rank).load_latest(model=fresh, optimizer=fresh_opt)
    loaded = full_state(fresh, fresh_opt)
    if rank == 0:
        same = all(torch.equal(loaded[i][k], v) for i in (0, 1) for k, v in saved[i].items())
        with open(f"{folder}/background.json", "w") as f:
            json.dump({"same": same, "step": got["step"], "extra": got["extra"], "hidden": hidden}, f)
    with open(f"{folder}/shown-{rank}.json", "w") as f:
        json.dump({"shown": shown, "step": got and got["step"]}, f)
    dist.barrier()
    dist.destroy_process_group()
    _leave()


@pytest.mark.slow  # it starts processes
def test_a_background_sharded_save_keeps_the_state_of_its_step_while_training_goes_on(tmp_path):
    from deeppod.contract import free_port

    (tmp_path / "ports.json").write_text(json.dumps({"rdv-background": free_port()}))
    mp.start_processes(_background, args=(2, str(tmp_path)), nprocs=2, start_method="spawn")
    got = json.loads((tmp_path / "background.json").read_text())
    assert got["same"] and got["step"] == 3 and got["extra"] == {"at": 3}
    assert got["hidden"] == [".ckpt-000000000003.dcp.tmp"]  # written in the background, not yet in place
    for rank in (0, 1):  # in place for every worker once wait() returns, and loaded by each
        assert json.loads((tmp_path / f"shown-{rank}.json").read_text()) == {
            "shown": ["ckpt-000000000003.dcp"], "step": 3}


class ConvBlock(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv, self.norm = torch.nn.Conv2d(channels, channels, 3, padding=1), torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        return x + torch.relu(self.norm(self.conv(x)))


def _alone(rank, folder):
    """A job of one worker: no process group until shard() makes one; bf16 compute (as on a
    GPU) on a model with batch norm, whose running statistics stay fp32."""
    import torch.distributed as dist

    from deeppod.runtime import Checkpointer
    from deeppod.runtime.sharding import shard

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                *[ConvBlock(8) for _ in range(3)], torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 3))
    os.environ["WORLD_SIZE"] = "2"
    try:
        shard(model)
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    os.environ["WORLD_SIZE"] = "1"
    model = shard(model, mixed_precision=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 3, 12, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
    losses = []
    for _ in range(4):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    Checkpointer(f"{folder}/ckpt-alone", rank=0).save(4, model=model, optimizer=opt, epoch=0)
    norm = model[2].norm
    with open(f"{folder}/alone.json", "w") as f:
        json.dump({"refused": refused, "losses": losses, "world": dist.get_world_size(),
                   "norm": [str(norm.weight.dtype), str(norm.running_mean.dtype)],
                   "moved": float(norm.running_mean.abs().sum()), "conv": str(model[2].conv.weight.dtype),
                   "saved": sorted(p.name for p in Path(folder, "ckpt-alone").iterdir())}, f)
    dist.destroy_process_group()
    _leave()


@pytest.mark.slow  # it starts processes
def test_one_worker_shards_without_a_process_group_and_keeps_batch_norm_in_fp32(tmp_path, monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    mp.start_processes(_alone, args=(str(tmp_path),), nprocs=1, start_method="spawn")
    got = json.loads((tmp_path / "alone.json").read_text())
    assert "call runtime.init() first" in got["refused"]  # a worker of a larger job must have joined it
    assert got["world"] == 1 and got["saved"] == ["ckpt-000000000004.dcp"]
    assert got["norm"] == ["torch.float32", "torch.float32"] and got["moved"] > 0
    assert got["conv"] == "torch.float32"  # the shards stay fp32; bf16 is what a block computes with
    assert all(v == v for v in got["losses"]) and got["losses"][-1] < got["losses"][0]


if sys.platform != "linux":
    pytestmark = pytest.mark.skip("Linux only")


@pytest.mark.slow  # it starts processes
def test_runtime_shard_is_the_function_whatever_was_imported_first():
    import subprocess

    code = ("import deeppod.runtime.checkpoint, deeppod.runtime.sharding\n"
            "from deeppod import runtime\n"
            "assert callable(runtime.shard) and runtime.shard.__name__ == 'shard', runtime.shard\n")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0

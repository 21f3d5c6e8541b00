"""Checkpoints: atomic, keep K, resume exactly (model, optimizer, scheduler, RNG, sampler)."""

import random

import pytest
import torch

from deeppod.runtime.checkpoint import Checkpointer
from deeppod.runtime.sampler import ElasticSampler


def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def train(model, opt, sched, steps):
    for _ in range(steps):
        x = torch.randn(8, 4)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return loss.item()


@pytest.mark.parametrize("background", [False, True])
def test_resume_continues_exactly_as_if_never_stopped(tmp_path, background):
    # reference: 6 uninterrupted steps
    model, opt, sched = make()
    torch.manual_seed(1)
    random.seed(1)
    train(model, opt, sched, 3)
    ref_state = {k: v.clone() for k, v in model.state_dict().items()}
    ref_loss = train(model, opt, sched, 3)
    # interrupted after 3 steps, resumed in fresh objects
    model2, opt2, sched2 = make()
    torch.manual_seed(1)
    random.seed(1)
    train(model2, opt2, sched2, 3)
    sampler = ElasticSampler(10, rank=0, world_size=1)
    sampler.advance(4)
    ck = Checkpointer(tmp_path, keep=2, background=background, rank=0)
    ck.save(3, model=model2, optimizer=opt2, scheduler=sched2, epoch=1, sampler=sampler, extra={"note": "x"})
    ck.wait()
    model3, opt3, sched3 = make()
    torch.manual_seed(999)  # the RNG is restored from the checkpoint
    s3 = ElasticSampler(10, rank=0, world_size=1)
    state = Checkpointer(tmp_path, rank=0).load_latest(model=model3, optimizer=opt3, scheduler=sched3, sampler=s3)
    assert state["step"] == 3 and state["epoch"] == 1 and state["extra"] == {"note": "x"}
    assert s3.position == 4
    assert all(torch.equal(ref_state[k], v) for k, v in model3.state_dict().items())
    assert train(model3, opt3, sched3, 3) == pytest.approx(ref_loss, abs=0, rel=0)


def test_keeps_the_last_k_and_skips_a_corrupt_newest(tmp_path):
    model, opt, _ = make()
    ck = Checkpointer(tmp_path, keep=2, rank=0)
    for step in (1, 2, 3):
        ck.save(step, model=model, optimizer=opt)
    names = [p.name for p in ck.checkpoints()]
    assert names == ["ckpt-000000000002.pt", "ckpt-000000000003.pt"]
    ck.checkpoints()[-1].write_bytes(b"garbage")  # e.g. a full disk
    assert ck.load_latest(model=model)["step"] == 2
    assert not list(tmp_path.glob(".*.tmp"))  # no temp files left behind


def test_only_rank_0_writes(tmp_path):
    model, _, _ = make()
    assert Checkpointer(tmp_path / "x", rank=1).save(1, model=model) is None
    assert not (tmp_path / "x").exists()
    assert Checkpointer(tmp_path / "x", rank=1).load_latest(model=model) is None


def test_background_save_does_not_see_later_changes(tmp_path):
    model, _, _ = make()
    ck = Checkpointer(tmp_path, background=True, rank=0)
    before = model.weight.detach().clone()
    ck.save(1, model=model)
    with torch.no_grad():
        model.weight.add_(100.0)  # training goes on while the file is written
    ck.wait()
    fresh, _, _ = make()
    Checkpointer(tmp_path, rank=0).load_latest(model=fresh)
    assert torch.equal(fresh.weight, before)

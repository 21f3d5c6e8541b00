"""A worker gives up the step under way when a new world comes (Resizer.interruptible): in its
forward pass or its backward pass, at the next block, with nothing updated; never outside a
step, in the first step at a new size, or (here without a process group) as a worker of several.
With real gloo workers in DDP: a peer waiting in the step's all-reduce gives it up too, and no
worker applies a step another gave up."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from deeppod.contract import ENV_WORLD_FILE, free_port
from deeppod.errors import StepAbandoned
from deeppod.runtime.context import JobContext
from deeppod.runtime.resize import POLL_S, RESIZE, Resizer, _blocks
from tests.runtime.probe_blocks import Backward, blocks

ran = {"forward": 0, "backward": 0}
when: dict = {}  # {"forward" or "backward": block index}: the block whose pass writes the new world


def write_world() -> None:
    path = os.environ[ENV_WORLD_FILE]
    with open(path + ".tmp", "w") as f:
        json.dump({"generation": 1, "world_size": 2, "master_addr": "127.0.0.1", "master_port": 1,
                   "decided_at": time.time()}, f)
    os.replace(path + ".tmp", path)


def on_pass(phase: str, index: int) -> None:
    ran[phase] += 1
    if when.get(phase) == index:
        write_world()
    time.sleep(2 * POLL_S)  # a block's work: the next look is due when the next block starts


def model() -> torch.nn.Module:
    return blocks(on_pass)


def step(m) -> None:
    m(torch.ones(2, 4)).sum().backward()


def ctx(world_size: int = 1) -> JobContext:
    return JobContext(job_id=None, rank=0, local_rank=0, world_size=world_size, local_world_size=world_size,
                      checkpoint_dir=None, api_url=None, restart_count=0)


@pytest.fixture(autouse=True)
def world_file(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_WORLD_FILE, str(tmp_path / "world.json"))
    ran.clear()
    ran.update(forward=0, backward=0)
    when.clear()


def test_a_new_world_ends_the_forward_pass_at_the_next_block_and_check_answers_resize():
    m = model()
    r = Resizer(m, ctx=ctx())
    when["forward"] = 2
    with pytest.raises(StepAbandoned), r.interruptible():
        step(m)
    assert ran == {"forward": 3, "backward": 0}
    assert all(p.grad is None for p in m.parameters())
    assert r.check() == RESIZE


def test_a_new_world_ends_the_backward_pass_at_the_next_block():
    m = model()
    r = Resizer(m, ctx=ctx())
    when["backward"] = 5  # the backward pass runs the blocks from the last: 7, 6, 5, ...
    with pytest.raises(StepAbandoned), r.interruptible():
        step(m)
    assert ran["forward"] == 8 and ran["backward"] == 3
    assert r.check() == RESIZE


class Inner(torch.autograd.Function):
    """Marks the middle of a block's backward pass."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ran["inner"] = ran.get("inner", 0) + 1
        return grad


class TwoLayers(torch.nn.Module):
    def __init__(self, index: int):
        super().__init__()
        self.a, self.b, self.index = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), index

    def forward(self, x):
        time.sleep(2 * POLL_S)
        return Backward.apply(self.b(Inner.apply(self.a(x))), self.index, on_pass)


def test_a_new_world_ends_the_backward_pass_as_a_block_begins_it():
    m = torch.nn.Sequential(*(TwoLayers(i) for i in range(8)))
    r = Resizer(m, ctx=ctx())
    when["backward"] = 5  # written as block 5's backward pass begins: its second layer's gradients come next
    with pytest.raises(StepAbandoned), r.interruptible():
        step(m)
    assert ran["backward"] == 3 and ran.get("inner") == 2  # blocks 7 and 6 ran through; 5 stopped before its middle


def test_workers_of_a_larger_job_and_steps_outside_it_run_to_their_end():
    m = model()
    write_world()
    with Resizer(m, ctx=ctx(world_size=2)).interruptible():
        step(m)
    assert ran == {"forward": 8, "backward": 8}
    ran.clear()
    ran.update(forward=0, backward=0)
    Resizer(m, ctx=ctx())
    step(m)  # not within interruptible(): evaluation, or a loop that does not ask for it
    assert ran == {"forward": 8, "backward": 8}


def test_the_first_step_at_a_new_size_is_not_given_up():
    m = model()
    r = Resizer(m, ctx=ctx())
    r._settled = False  # a switch's (or a joiner's) first step: every worker of the new group agrees
    write_world()
    with r.interruptible():
        step(m)
    assert ran == {"forward": 8, "backward": 8}


def test_blocks_are_the_shallowest_level_with_eight_modules():
    import torchvision

    resnet = torchvision.models.resnet50()
    assert [type(b).__name__ for b in _blocks(resnet)][:4] == ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d"]
    assert len(_blocks(resnet)) == 10
    assert len(_blocks(model())) == 8
    linear = torch.nn.Linear(2, 2)
    assert _blocks(linear) == [linear]


# -- workers of a larger job (gloo, real processes) -------------------------------------

JOB = Path(__file__).with_name("interruptible_job.py")


def run_pair(tmp_path, writer: str, new_size: int, codes=(0, 0), **extra) -> dict:
    """Two workers in DDP; in step 2 the WRITER's block writes a world of ``new_size`` workers."""
    out = tmp_path / "out"
    out.mkdir()
    port, new_port = free_port(), free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WRITER": writer, "NEW_SIZE": str(new_size),
               "NEW_PORT": str(new_port), "OMP_NUM_THREADS": "1", ENV_WORLD_FILE: str(tmp_path / "world.json"),
               **extra}
        procs.append(subprocess.Popen([sys.executable, str(JOB), str(out)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        for p, code in zip(procs, codes):
            # The old group's own timeout is 30 minutes: a peer left waiting in it would be caught here.
            output, _ = p.communicate(timeout=120)
            assert p.returncode == code, output
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return {rank: json.loads((out / f"rank-{rank}.json").read_text()) for rank in (0, 1)}


@pytest.mark.slow  # it starts processes
def test_a_worker_gives_up_in_its_forward_pass_and_its_peer_waiting_in_the_all_reduce_gives_up_too(tmp_path):
    got = run_pair(tmp_path, "0:forward:2", new_size=1)
    zero, one = got[0], got[1]
    assert "world generation 1 is there" in zero["gave_up"]["why"]
    assert "a peer gave the step up" in one["gave_up"]["why"]  # it was in the step's all-reduce
    assert zero["gave_up"]["step"] == one["gave_up"]["step"] == 3
    # nothing of the given-up step was applied on either: both hold step 2's weights
    assert zero["gave_up"]["weights"] == one["gave_up"]["weights"] == zero["steps"][1] == one["steps"][1]
    assert one["steps"] == zero["steps"][:2] and "world_size" not in one  # rank 1 left at the switch
    assert zero["world_size"] == 1 and len(zero["steps"]) == 4  # the step done again, alone


@pytest.mark.slow  # it starts processes
def test_a_peer_that_gives_up_in_its_backward_pass_releases_the_other_and_both_go_on_together(tmp_path):
    got = run_pair(tmp_path, "1:backward:5", new_size=2)
    zero, one = got[0], got[1]
    assert "world generation 1 is there" in one["gave_up"]["why"]
    assert "a peer gave the step up" in zero["gave_up"]["why"]
    assert zero["gave_up"]["weights"] == one["gave_up"]["weights"] == zero["steps"][1]
    assert zero["world_size"] == one["world_size"] == 2
    assert zero["steps"] == one["steps"] and len(zero["steps"]) == 4  # the same updates in the new group


@pytest.mark.slow  # it starts processes
def test_a_worker_that_cannot_let_go_of_the_old_group_restarts_and_its_exit_releases_the_peer(tmp_path):
    got = run_pair(tmp_path, "0:forward:2", new_size=1, codes=(75, 0), KEEP="0")
    zero, one = got[0], got[1]
    assert zero["stopped"] and "world generation 1 is there" in zero["gave_up"]["why"]  # resize() said "stop"
    assert "a peer gave the step up" in one["gave_up"]["why"]  # released when rank 0 exited, then it left
    assert zero["gave_up"]["weights"] == one["gave_up"]["weights"] == zero["steps"][1]

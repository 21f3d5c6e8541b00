"""Handing rank 0's state to joiners: tensors split from the pickled skeleton, one flat
transfer per dtype, through shared memory on one host or a broadcast otherwise."""

import os
import stat
import sys
from collections import namedtuple

import pytest
import torch
import torch.multiprocessing as mp

from deeppod.runtime import _broadcast
from deeppod.runtime.stop import exit_process


def adam_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


def test_split_and_fill_give_back_the_same_state_with_only_small_things_left_to_pickle():
    _, opt = adam_state()
    state = {"optimizer": opt.state_dict(), "sampler": {"position": 7}, "state": {"step": 3, "tags": ["a", (1, 2)]}}
    tensors = []
    skeleton = _broadcast.split(state, tensors)
    assert tensors and all(isinstance(s, _broadcast.Slot) for s in _broadcast.slots(skeleton))
    assert [s.index for s in _broadcast.slots(skeleton)] == list(range(len(tensors)))
    assert not any(isinstance(v, torch.Tensor) for v in _walk(skeleton))
    back = _broadcast.fill(skeleton, tensors)
    assert back["sampler"] == {"position": 7} and back["state"] == {"step": 3, "tags": ["a", (1, 2)]}
    for key, per_param in state["optimizer"]["state"].items():
        for name, value in per_param.items():
            assert torch.equal(back["optimizer"]["state"][key][name], value)
    empty = _broadcast.receive_like(skeleton, "cpu")
    assert [(t.shape, t.dtype) for t in empty] == [(t.shape, t.dtype) for t in tensors]


def _walk(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _walk(v)
    else:
        yield obj


def test_a_shared_file_carries_every_dtype_and_shape_and_only_its_owner_reads_it(tmp_path):
    sent = [torch.randn(3, 5), torch.tensor(4.0), torch.arange(7, dtype=torch.int64),
            torch.ones(2, dtype=torch.float16), torch.zeros(0)]
    path = _broadcast.write_shared(sent, str(tmp_path))
    assert path is not None and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    got = [torch.empty_like(t) for t in sent]
    _broadcast.read_shared(path, got)
    assert all(torch.equal(a, b) for a, b in zip(sent, got))


def test_a_shared_file_fills_bf16_non_contiguous_and_parameter_tensors_and_a_short_one_is_an_error(tmp_path):
    sent = [torch.randn(4, 6).to(torch.bfloat16), torch.randn(5, 3), torch.nn.Parameter(torch.randn(8))]
    path = _broadcast.write_shared([sent[0], sent[1].t(), sent[2]], str(tmp_path))  # the middle one transposed
    got = [torch.empty(4, 6, dtype=torch.bfloat16), torch.empty(5, 3).t(), torch.nn.Parameter(torch.empty(8))]
    _broadcast.read_shared(path, got)
    assert torch.equal(got[0], sent[0]) and torch.equal(got[1], sent[1].t()) and torch.equal(got[2], sent[2])
    os.truncate(path, 16)
    with pytest.raises(ValueError, match="ends before its tensors do"):
        _broadcast.read_shared(path, got)


def test_no_shared_file_when_the_folder_has_no_room(tmp_path, monkeypatch):
    full = namedtuple("statvfs", "f_bavail f_frsize")(1, 4096)
    monkeypatch.setattr(os, "statvfs", lambda _path: full)
    assert _broadcast.write_shared([torch.randn(1000)], str(tmp_path)) is None
    assert list(tmp_path.iterdir()) == []


def _sync_worker(rank, folder, shm, result):
    import torch.distributed as dist

    from deeppod.runtime import resize
    from deeppod.runtime.context import JobContext

    resize.SHM = shm
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=3)
    torch.manual_seed(rank)  # each starts with other weights
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = {"step": 0}
    if rank < 2:  # the two that stayed trained the same steps
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        state = {"step": 1}
    ctx = JobContext(job_id=None, rank=rank, local_rank=rank, world_size=3, local_world_size=3, checkpoint_dir=None,
                     api_url=None, restart_count=0)
    resizer = resize.Resizer(model, opt, None, state, ctx=ctx)
    resizer._sync(joined=rank == 2)
    mine = [*model.state_dict().values(), *(s["momentum_buffer"] for s in opt.state_dict()["state"].values())]
    everyone = [None] * 3
    dist.all_gather_object(everyone, ([t.clone() for t in mine], state))
    if rank == 0:
        same = all(torch.equal(a, b) for other in everyone[1:] for a, b in zip(everyone[0][0], other[0]))
        same = same and all(s[1] == {"step": 1} for s in everyone) and len(everyone[2][0]) == len(mine)
        with open(result, "w") as f:
            f.write("same" if same else "different")
    dist.destroy_process_group()
    exit_process(0)  # no interpreter teardown under a gloo thread (runtime/stop.py says why)


@pytest.mark.slow  # it starts processes
@pytest.mark.parametrize("how", ["shared memory", "broadcast"])
def test_a_joiner_gets_rank_zeros_weights_momentum_and_state(tmp_path, how):
    shm = str(tmp_path / "shm") if how == "shared memory" else str(tmp_path / "no-such-folder")
    if how == "shared memory":
        os.mkdir(shm)
    result = tmp_path / "result"
    mp.start_processes(_sync_worker, args=(str(tmp_path), shm, str(result)), nprocs=3, start_method="spawn")
    assert result.read_text() == "same"
    if how == "shared memory":
        assert os.listdir(shm) == [], "rank 0 removes the file once every joiner has read it"


if sys.platform != "linux":  # /proc's boot id and /dev/shm
    pytestmark = pytest.mark.skip("Linux only")

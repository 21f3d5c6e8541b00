"""deeppod.runtime.data: the loader's output, its crops, and exact-once sharding."""

import os
import random
import signal
import tarfile
import threading

import pytest
import torch

from deeppod.datasets.ingest import Limits, build
from deeppod.datasets.objects import ObjectStore
from deeppod.datasets.policy import Policy
from deeppod.runtime.data import (
    ImageDataset,
    ShardReader,
    center_box,
    dataset_path,
    decode_crop,
    loader,
    normalize,
    random_resized_crop_box,
    stop_safe_loader,
)
from deeppod.runtime.sampler import ElasticSampler
from tests.datasets.images import class_folders, image_bytes


@pytest.fixture(scope="module")
def version(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("v")
    src = class_folders(tmp / "src", classes=("a", "b", "c"), per_class=7, size=(96, 80))
    with tarfile.open(tmp / "up.tar", "w") as tar:
        tar.add(src, arcname="src")
    build(tmp / "up.tar", tmp / "version", ObjectStore(tmp / "objects"), Policy.parse({"val": 0.3}),
          Limits(1 << 20, 1 << 30))
    return tmp / "version"


@pytest.mark.slow  # it starts processes
def test_batches_are_uint8_nchw_with_labels(version):
    ds = ImageDataset(version, None, size=32)
    batches = list(loader(ds, batch_size=8, workers=2))
    assert [len(y) for _, y in batches] == [8, 8, 5]
    x, y = batches[0]
    assert x.dtype == torch.uint8 and x.shape == (8, 3, 32, 32)
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == sorted(ShardReader(version).labels)
    n = normalize(x)
    assert n.dtype == torch.float32 and abs(n.mean().item()) < 5


class _WhereBatchesAre:
    """Says whether a batch tensor made where it runs is in shared memory."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        from deeppod.runtime.data import _batch_tensor

        return _batch_tensor((2, 3, 4, 4)).is_shared()


@pytest.mark.slow  # it starts processes
def test_a_worker_builds_its_batch_in_shared_memory_so_handing_it_over_copies_nothing():
    from deeppod.runtime.data import _batch_tensor

    assert not _batch_tensor((2, 3, 4, 4)).is_shared()  # no worker: ordinary memory
    got = list(stop_safe_loader(_WhereBatchesAre(), batch_size=None, num_workers=1))
    assert got == [True, True]


def test_evaluation_crops_are_deterministic_and_training_crops_vary(version):
    val = ImageDataset(version, None, size=32, train=False)
    assert torch.equal(val[0][0], val[0][0])
    train = ImageDataset(version, None, size=32, train=True, seed=1)
    assert not all(torch.equal(train[0][0], train[0][0]) for _ in range(3))


def test_splits(version):
    assert len(ShardReader(version, "train")) + len(ShardReader(version, "val")) == 21
    with pytest.raises(ValueError, match="split"):
        ShardReader(version, "test")


def test_draft_decoding_matches_a_full_decode_closely():
    import io

    from PIL import Image

    data = image_bytes(3, (900, 700))
    box = (10, 20, 880, 660)
    fast = decode_crop(data, lambda w, h: box, 64)
    full = Image.open(io.BytesIO(data)).convert("RGB").resize((64, 64), Image.BILINEAR, box=box)
    ref = torch.from_numpy(__import__("numpy").array(full)).permute(2, 0, 1)
    assert fast.shape == (3, 64, 64)
    assert (fast.float() - ref.float()).abs().mean() < 6  # same picture; the DCT scaling differs slightly


def test_crop_boxes_stay_inside_the_image():
    rng = random.Random(0)
    for _ in range(2000):
        w, h = rng.randint(1, 900), rng.randint(1, 900)
        left, top, cw, ch = random_resized_crop_box(w, h, rng)
        assert 0 <= left and 0 <= top and cw > 0 and ch > 0 and left + cw <= w and top + ch <= h
    assert center_box(256, 256, 224) == (16, 16, 224, 224)


def test_elastic_sampler_shards_every_sample_exactly_once_across_ranks(version):
    ds = ImageDataset(version, None, size=16, train=False)
    seen = []
    for rank in range(3):
        sampler = ElasticSampler(len(ds), rank=rank, world_size=3, seed=4)
        for _, y in loader(ds, batch_size=4, sampler=sampler, workers=0):
            seen.extend(y.tolist())
    assert sorted(seen) == sorted(ShardReader(version).labels)


def test_dataset_path_needs_the_platform_to_stage_it(monkeypatch, tmp_path):
    monkeypatch.delenv("DEEPPOD_DATA_CHEST_XRAY", raising=False)
    with pytest.raises(FileNotFoundError, match="--dataset chest-xray"):
        dataset_path("chest-xray@2")
    monkeypatch.setenv("DEEPPOD_DATA_CHEST_XRAY", str(tmp_path))
    assert dataset_path("chest-xray@2") == tmp_path


def _photo(seed: int, size=(517, 389), subsampling: str = "4:2:0", mode: str = "RGB") -> bytes:
    import io

    import numpy as np
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(seed)
    arr = (rng.random((size[1], size[0], 3)) * 255).astype("uint8")
    im = Image.fromarray(arr).filter(ImageFilter.GaussianBlur(3)).convert(mode)  # photo-like: detail, no aliasing
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90, **({"subsampling": subsampling} if mode == "RGB" else {}))
    return buf.getvalue()


@pytest.mark.parametrize("subsampling", ["4:2:0", "4:2:2", "4:4:4"])
def test_region_decoding_gives_the_pixels_a_whole_decode_gives(subsampling):
    """At full scale the region decoder's box is exactly Pillow's whole-image decode, cropped:
    only the work outside the box is skipped."""
    import io

    import numpy as np
    from PIL import Image

    from deeppod.runtime import decode

    if decode._jpeg is None:
        pytest.skip("region decoding was not built here (no libjpeg-turbo headers)")
    jpeg = _photo(0, subsampling=subsampling)
    full = np.array(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    rng = random.Random(1)
    for _ in range(100):
        w, h = rng.randint(1, 517), rng.randint(1, 389)
        left, top = rng.randint(0, 517 - w), rng.randint(0, 389 - h)
        rgb, rw, rh, num = decode._jpeg.region(jpeg, left, top, w, h, 10_000)  # too few pixels for any scaling
        assert num == 8 and (rw, rh) == (w, h)
        assert np.array_equal(np.frombuffer(rgb, np.uint8).reshape(h, w, 3), full[top:top + h, left:left + w])


def test_region_decoding_scales_down_only_as_far_as_the_crop_allows():
    from deeppod.runtime import decode

    if decode._jpeg is None:
        pytest.skip("region decoding was not built here (no libjpeg-turbo headers)")
    jpeg = _photo(2)
    assert decode._jpeg.size(jpeg) == (517, 389)
    _, w, h, num = decode._jpeg.region(jpeg, 0, 0, 512, 384, 224)
    assert num == 5 and (w, h) == (320, 240)  # 4/8 would leave 192 rows: fewer than 224
    _, w, h, num = decode._jpeg.region(jpeg, 10, 10, 100, 100, 224)
    assert num == 8 and (w, h) == (100, 100)  # a small crop: full scale
    with pytest.raises(ValueError, match="outside"):
        decode._jpeg.region(jpeg, 500, 0, 100, 100, 224)
    with pytest.raises(ValueError):
        decode._jpeg.region(b"\xff\xd8 not a jpeg", 0, 0, 1, 1, 1)
    with pytest.raises(ValueError):  # truncated: libjpeg would fill in grey; refused, Pillow decides
        decode._jpeg.region(jpeg[: len(jpeg) // 2], 0, 0, 512, 384, 224)
    with pytest.raises(OSError):  # and Pillow refuses it, as before the region decoder
        decode_crop(jpeg[: len(jpeg) // 2], lambda w, h: (0, 0, w, h), 64)


def test_decode_crop_is_the_same_picture_with_or_without_the_region_decoder(monkeypatch):
    from deeppod.runtime import decode

    jpeg = _photo(3)
    for box in [(0, 0, 517, 389), (37, 11, 230, 301), (100, 80, 60, 90)]:
        fast = decode_crop(jpeg, lambda w, h: box, 64)
        with monkeypatch.context() as m:
            m.setattr(decode, "_jpeg", None)
            pillow = decode_crop(jpeg, lambda w, h: box, 64)
        assert fast.shape == pillow.shape == (3, 64, 64)
        assert (fast.float() - pillow.float()).abs().mean() < 4  # identical pixels; DCT scales may differ


def test_jpegs_the_region_decoder_cannot_read_fall_back_to_pillow_with_the_same_box():
    cmyk = _photo(4, size=(120, 90), mode="CMYK")
    boxes = []

    def box(w, h):
        boxes.append((w, h))
        return (10, 10, 64, 64)

    x = decode_crop(cmyk, box, 32)
    assert x.shape == (3, 32, 32) and len(boxes) == 1  # the box was drawn once: the sampler's randomness is kept
    png = image_bytes(5, (60, 50), fmt="PNG")
    assert decode_crop(png, lambda w, h: (0, 0, w, h), 16).shape == (3, 16, 16)


class _Pids:
    """Each sample is the pid of the worker process that loaded it and its signal state."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        ignored = int(next(line for line in open("/proc/self/status") if line.startswith("SigIgn:")).split()[1], 16)
        return torch.tensor([os.getpid(), os.getppid(), ignored >> (signal.SIGTERM - 1) & 1])


@pytest.mark.slow  # it starts processes
def test_loader_workers_come_from_a_single_threaded_fork_server_and_ignore_sigterm():
    """Not forked from the training process, whose native threads can leave a child hung on
    CPython < 3.12 (python/cpython#112275): from the fork server, which ignores SIGTERM."""
    from multiprocessing import forkserver

    busy = threading.Thread(target=lambda: [threading.Thread(target=int).start() for _ in range(200)])
    busy.start()  # threads starting and ending while the workers start
    rows = torch.cat([b for b in stop_safe_loader(_Pids(), batch_size=1, num_workers=2)])
    busy.join()
    server = forkserver._forkserver._forkserver_pid
    assert {int(pid) for pid in rows[:, 0]} - {os.getpid()} and all(int(p) == server for p in rows[:, 1])
    assert rows[:, 2].tolist() == [1, 1, 1, 1]
    ignored = int(next(line for line in open(f"/proc/{server}/status") if line.startswith("SigIgn:")).split()[1], 16)
    assert ignored >> (signal.SIGTERM - 1) & 1
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # this process still gets its SIGTERM


@pytest.mark.parametrize("train", [True, False])
def test_decoding_on_the_device_gives_the_worker_decodes_crops(version, train):
    """decode_on: the workers send JPEG bytes and the crops they drew; the device decodes.
    Same random stream, so the same crops and flips; PNGs are decoded in the worker. (The
    device here is the CPU: nvJPEG's path is the same call with device="cuda".)"""
    on_cpu = list(loader(ImageDataset(version, None, size=32, train=train, seed=5), batch_size=8, workers=0))
    on_dev = list(loader(ImageDataset(version, None, size=32, train=train, seed=5), batch_size=8, workers=0,
                         decode_on="cpu"))
    assert [y.tolist() for _, y in on_dev] == [y.tolist() for _, y in on_cpu]
    for (a, _), (b, _) in zip(on_cpu, on_dev):
        assert b.dtype == torch.uint8 and b.shape == a.shape
        # the worker decodes the crop's region at a reduced DCT scale, the device the whole image
        assert (a.float() - b.float()).abs().mean() < 1  # another seed's crops: 2.0


@pytest.mark.slow  # it starts processes
def test_device_decoding_with_worker_processes_and_a_jpeg_it_cannot_read(version):
    from deeppod.runtime.decode import _decode_jpegs

    batches = list(loader(ImageDataset(version, None, size=24), batch_size=5, workers=2, decode_on="cpu"))
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == sorted(ShardReader(version).labels)
    assert all(x.shape[1:] == (3, 24, 24) for x, _ in batches)
    good = torch.frombuffer(bytearray(image_bytes(1, (40, 30))), dtype=torch.uint8)
    bad = torch.frombuffer(bytearray(b"\xff\xd8" + bytes(200)), dtype=torch.uint8)
    decoded = _decode_jpegs([good, bad], "cpu")
    assert decoded[0].shape == (3, 30, 40) and decoded[1] is None


_FORKED_SERVER = """
import os, sys, torch
from deeppod.runtime.data import prestart, stop_safe_loader

class Pids:
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return torch.tensor([os.getpid(), os.getppid()])

if __name__ == "__main__":
    prestart()  # before init: this process has torch and no thread that enters Python
    from multiprocessing import forkserver
    server = forkserver._forkserver._forkserver_pid
    own = open("/proc/self/cmdline").read()
    print(open(f"/proc/{server}/cmdline").read() == own,
          all(int(p) == server for p in torch.cat(list(stop_safe_loader(Pids(), batch_size=1, num_workers=2)))[:, 1]))
"""


@pytest.mark.slow  # it starts processes
def test_prestart_makes_the_fork_server_a_fork_of_the_trainer_with_no_second_torch_import(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(_FORKED_SERVER)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr


def test_once_threads_that_enter_python_may_run_the_server_is_spawned_instead():
    from deeppod.runtime import _workers

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not _workers._safe_to_fork()
    finally:
        stop.set()
        t.join()

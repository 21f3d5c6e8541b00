"""deeppod.runtime.data: the loader's output, its crops, and exact-once sharding."""

import random
import tarfile

import pytest
import torch

from deeppod.datasets.ingest import Limits, build
from deeppod.datasets.objects import ObjectStore
from deeppod.datasets.policy import Policy
from deeppod.runtime.data import (ImageDataset, ShardReader, center_box, dataset_path, decode_crop, loader,
                                  normalize, random_resized_crop_box)
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


def test_batches_are_uint8_nchw_with_labels(version):
    ds = ImageDataset(version, None, size=32)
    batches = list(loader(ds, batch_size=8, workers=2))
    assert [len(y) for _, y in batches] == [8, 8, 5]
    x, y = batches[0]
    assert x.dtype == torch.uint8 and x.shape == (8, 3, 32, 32)
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == sorted(ShardReader(version).labels)
    n = normalize(x)
    assert n.dtype == torch.float32 and abs(n.mean().item()) < 5


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
    from PIL import Image
    import io

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

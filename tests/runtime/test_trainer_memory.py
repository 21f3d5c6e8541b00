"""The built-in trainer's memory estimate: a model's shape from the meta device, what each
strategy keeps per worker, and the choice ``deeppod train --memory`` makes from it."""

import numpy as np
import pytest
import torch
from PIL import Image

from deeppod.errors import InvalidRequest
from deeppod.runtime.trainers import memory
from deeppod.runtime.trainers.image_classifier import build_model

MB = 1 << 20


def meta(name, classes=10):
    with torch.device("meta"):
        return build_model(name, classes)


def test_the_shape_comes_from_the_meta_device_without_allocating():
    s = memory.shape(meta("resnet50"), 32)
    assert s.params == sum(p.numel() for p in build_model("resnet50", 10).parameters())
    whole = build_model("resnet50", 10)
    assert s.largest_block == sum(p.numel() for p in whole.layer4[0].parameters())  # the bottleneck that downsamples
    assert 0 < s.root_own < 100_000  # the stem and the classifier
    assert s.block_inputs_per_sample < s.activations_per_sample
    assert s.largest_block_activations < s.activations_per_sample
    bigger = memory.shape(meta("resnet50"), 64)
    assert bigger.activations_per_sample == pytest.approx(4 * s.activations_per_sample, rel=0.05)


def test_sharding_divides_what_every_worker_keeps():
    s = memory.shape(meta("resnet101"), 32)
    how = {"per_worker_batch": 8, "optimizer": "adam", "loader_workers": 2}
    ddp = memory.estimate(s, strategy="ddp", workers=2, **how)
    two = memory.estimate(s, strategy="fsdp", workers=2, **how)
    four = memory.estimate(s, strategy="fsdp", workers=4, **how)
    assert four.total_mb < two.total_mb < ddp.total_mb
    assert ddp.parts["optimizer"] == round(2 * 4 * s.params / MB)  # Adam: two copies of the weights
    assert two.parts["optimizer"] == round(2 * 4 * s.params // 2 / MB)
    sgd = memory.estimate(s, strategy="ddp", workers=2, **{**how, "optimizer": "sgd"})
    assert sgd.parts["optimizer"] == 0
    ac = memory.estimate(s, strategy="fsdp", workers=2, activation_checkpointing=True, **{**how,
                                                                                          "per_worker_batch": 64})
    assert ac.parts["activations"] < memory.estimate(s, strategy="fsdp", workers=2, **{**how, "per_worker_batch": 64}
                                                     ).parts["activations"]
    assert "fsdp at 2 workers" in two.text() and "weight shards" in two.text()


def test_the_cheapest_way_that_fits_is_chosen_and_none_that_does_not():
    s = memory.shape(meta("resnet101"), 32)
    how = {"workers": 2, "per_worker_batch": 8, "optimizer": "adam", "loader_workers": 2}
    ddp = memory.estimate(s, strategy="ddp", **how).total_mb
    fsdp = memory.estimate(s, strategy="fsdp", **how).total_mb
    assert memory.choose(s, ddp, strategy=None, activation_checkpointing=None, **how).strategy == "ddp"
    assert memory.choose(s, ddp - 1, strategy=None, activation_checkpointing=None, **how).strategy == "fsdp"
    assert memory.choose(s, ddp, strategy="fsdp", activation_checkpointing=None, **how).strategy == "fsdp"
    with pytest.raises(ValueError) as refused:
        memory.choose(s, fsdp - 100, strategy=None, activation_checkpointing=None, **how)
    assert str(refused.value).count(" MiB per worker") == 3  # every way tried, with its estimate
    with pytest.raises(ValueError):
        memory.choose(s, ddp - 1, strategy="ddp", activation_checkpointing=None, **how)


@pytest.fixture
def images(tmp_path):
    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
        for i in range(4):
            Image.fromarray(np.zeros((40, 30, 3), "uint8")).save(tmp_path / c / f"{i}.png")
    return tmp_path


def test_plan_adds_the_strategy_that_fits_or_refuses_with_the_estimates(images):
    base = ["--data", str(images), "--model", "resnet101", "--batch-size", "16", "--optimizer", "adam"]
    args, e = memory.plan(base, 100_000, 2)
    assert args == [*base, "--strategy", "ddp"] and e.strategy == "ddp"
    assert "image-size" not in " ".join(args)  # the trainer picks the size; the estimate used the same (40 px)
    fsdp_only = memory.estimate(memory.shape(meta("resnet101", 2), 40), strategy="fsdp", workers=2,
                                per_worker_batch=8, optimizer="adam", loader_workers=2).total_mb
    args, e = memory.plan(base, fsdp_only, 2)
    assert args[-2:] == ["--strategy", "fsdp"] and e.strategy == "fsdp" and e.total_mb == fsdp_only
    with pytest.raises(InvalidRequest) as refused:
        memory.plan([*base, "--strategy", "ddp"], fsdp_only, 2)
    assert "does not fit in" in str(refused.value) and "ddp at 2 workers" in str(refused.value)
    assert "fsdp" not in str(refused.value).split(":")[1]  # only the strategy asked for
    with pytest.raises(InvalidRequest) as refused:
        memory.plan(base, 500, 2)
    assert "more workers (-n)" in str(refused.value)
    with pytest.raises(InvalidRequest) as refused:
        memory.plan(["--data", str(images / "cat"), "--model", "resnet101"], 100_000, 2)
    assert "two class folders" in str(refused.value)


# -- GPU memory --------------------------------------------------------------------------------

def test_on_a_gpu_a_sharded_parameter_costs_16_bytes_and_offload_leaves_the_working_set():
    """The parts as counted on an H200 (docs/benchmarks.md, "Large models on one GPU"): fp32
    weight and gradient and two Adam moments, in GPU memory; with offload only what a step
    gathers, whatever the model's size."""
    s = memory.shape(meta("resnet152"), 32)
    how = {"per_worker_batch": 8, "optimizer": "adamw", "loader_workers": 2, "device": "gpu"}
    one = memory.estimate(s, strategy="fsdp", workers=1, **how)
    per_param = sum(one.parts[k] for k in ("weight shards", "gradient shards", "optimizer")) * MB / s.params
    assert per_param == pytest.approx(16, rel=0.01)
    assert "process" not in one.parts and one.parts["CUDA context"] == memory.CUDA_CONTEXT_MB
    assert "MiB per GPU" in one.text()
    ddp = memory.estimate(s, strategy="ddp", workers=2, **how)
    assert ddp.parts["checkpoint copy"] == 0  # the copy is taken to host memory
    assert ddp.total_mb > memory.estimate(s, strategy="fsdp", workers=2, **how).total_mb
    offload = memory.estimate(s, strategy="fsdp", workers=1, offload=True, **how)
    assert set(offload.parts) == {"gathered blocks", "activations", "CUDA context"}
    assert offload.total_mb < one.total_mb / 2
    # in bf16 (AMP, or the sharded model's mixed precision) activations take half of fp32's bytes
    fp32 = memory.estimate(s, strategy="ddp", workers=2, amp=False, **how)
    assert ddp.parts["activations"] == pytest.approx(fp32.parts["activations"] / 2, abs=1)
    host = memory.estimate(s, strategy="ddp", workers=2, per_worker_batch=8, optimizer="adamw", loader_workers=2)
    assert host.parts["activations"] == fp32.parts["activations"]


def test_a_gpu_plan_takes_the_model_a_gpu_would_and_refuses_with_what_to_do(images):
    base = ["--data", str(images), "--batch-size", "16", "--optimizer", "adam"]
    args, e = memory.plan(base, None, 2, device="gpu")  # memory not known: the cheapest way, and its estimate
    assert args[-2:] == ["--strategy", "ddp"] and e.device == "gpu"
    resnet18 = memory.estimate(memory.shape(meta("resnet18", 2), 40), strategy="ddp", workers=2, per_worker_batch=8,
                               optimizer="adam", loader_workers=4, device="gpu")
    assert e.total_mb == resnet18.total_mb  # 'auto' is resnet18 on a GPU
    fsdp = memory.estimate(memory.shape(meta("resnet152", 2), 40), strategy="fsdp", workers=2, per_worker_batch=8,
                           optimizer="adam", loader_workers=2, device="gpu")
    args, e = memory.plan([*base, "--model", "resnet152"], fsdp.total_mb, 2, device="gpu")
    assert args[-2:] == ["--strategy", "fsdp"] and e.total_mb == fsdp.total_mb
    # less than that: sharded and offloaded to host memory, the last way on a GPU (never for DDP)
    args, e = memory.plan([*base, "--model", "resnet152"], fsdp.total_mb - 100, 2, device="gpu")
    assert args[-3:] == ["--strategy", "fsdp", "--offload"] and e.offload and "with offload" in e.text()
    with pytest.raises(InvalidRequest) as refused:
        memory.plan([*base, "--model", "resnet152", "--strategy", "ddp"], fsdp.total_mb - 100, 2, device="gpu")
    assert "offload" not in str(refused.value).split(". Ask")[0]
    with pytest.raises(InvalidRequest) as refused:
        memory.plan([*base, "--model", "resnet152"], 500, 2, device="gpu")
    said = str(refused.value)
    assert "does not fit in 500 MiB per GPU" in said and "--gpu-memory" in said
    assert "fsdp with activation checkpointing and offload at 2 workers" in said  # every way was tried
    host, _ = memory.plan([*base, "--model", "resnet152"], 100_000, 2)
    assert "--offload" not in host  # host memory: offload is no way to save it

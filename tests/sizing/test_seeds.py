"""``deeppod size`` against the configurations the seeds publish (docs/scheduler.md, "Against
the seeds"): the figures the docs quote are these tests' answers."""

import math

import pytest

from deeppod.sizing.model import Workload, size

IMAGENET = 1_281_167
V100 = 12_000 / 16  # vScaler: one DGX-2 (16 V100) trains ResNet-50 at over 12,000 images/s


def run_hours(rate: float) -> float:
    """90 epochs of ImageNet at ``rate`` images/s."""
    return IMAGENET * 90 / rate / 3600


def test_vscaler_s_dgx2_is_one_node_of_16_with_3_cores_a_gpu():
    r = size(Workload(IMAGENET, 90, run_hours(12_000), V100, scaling=1.0, gpus_per_node=16, simulate=False))
    assert (r.gpus, r.nodes, r.cpus_per_gpu) == (16, 1, 3)  # the DGX-2's two 24-core CPUs: 3 a GPU
    assert r.read_gb_s == pytest.approx(1.32)  # against the seed's 30 TB of NVMe in the box


def test_deeppods_default_scaling_asks_a_second_node_for_the_same_rate():
    r = size(Workload(IMAGENET, 90, run_hours(12_000), V100, gpus_per_node=16, simulate=False))
    assert (r.job_gpus, r.nodes) == (18, 2)  # 90% past one GPU; the seed saw near-linear on NVSwitch


def test_the_storage_seed_s_nine_dgx1s_read_a_seventh_of_one_ess3000():
    r = size(Workload(IMAGENET, 90, run_hours(72 * V100), V100, scaling=1.0, gpus_per_node=8, simulate=False))
    assert (r.gpus, r.nodes) == (72, 9)
    assert r.read_gb_s == pytest.approx(5.94)
    assert math.floor(40 / r.read_gb_s) == 6  # one ESS 3000 (about 40 GB/s) has 6x that


@pytest.mark.parametrize("users, gpus", [(2, 8), (16, 32)])
def test_fujitsu_s_sample_configurations_serve_this_many_users(users, gpus):
    """Users each starting an 8-GPU ResNet-50 run every other day, a p95 wait of an hour, on
    two-GPU nodes: the small (8 GPUs) and moderate (32 GPUs) samples."""
    r = size(Workload(IMAGENET, 90, 24, V100, job_gpus=8, users=users, runs_per_user_day=0.5, wait_minutes=60,
                      gpus_per_node=2))
    assert (r.gpus, r.nodes) == (gpus, gpus // 2)

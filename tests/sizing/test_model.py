"""The sizing model: each figure from the workload as docs/scheduler.md says, the team's size
from the scheduler's simulator (the smallest size that meets the wait, the one below does
not), and bad input refused with what to fix."""

import pytest

from deeppod.errors import InvalidRequest
from deeppod.sizing import Workload, size
from deeppod.sizing.model import gpus_for

IMAGENET = {"images": 1_281_167, "epochs": 90, "image_kb": 110.0}


def test_one_run_the_loader_and_the_storage():
    r = size(Workload(**IMAGENET, hours=8, images_per_gpu=1400, simulate=False))
    need = 1_281_167 * 90 / (8 * 3600)  # 4,004 images/s
    assert r.job_gpus == 4 and r.job_gpus * 1400 * 0.9 >= need > 3 * 1400 * 0.9
    assert r.cpus_per_gpu == 3  # 1,400 images/s at 700 a core, and one for the training process
    assert r.read_gb_s == pytest.approx(r.training_gpus * 1400 * 110e3 / 1e9, abs=0.01)
    assert r.capacity_tb == pytest.approx(1_281_167 * 110e3 * 3 / 1e12, abs=0.001)
    assert gpus_for(1000, 1000, 0.5) == 1 and gpus_for(1001, 1000, 0.5) == 3  # two GPUs at 50% give only 1,000


def test_the_team_gets_the_smallest_size_whose_simulated_wait_meets_the_target():
    w = Workload(**IMAGENET, hours=24, images_per_gpu=2900, users=10, runs_per_user_day=0.5, wait_minutes=60)
    r = size(w)
    met = [x for x in r.waits if x["p95_wait_min"] <= 60]
    assert met and met[0]["gpus"] == r.training_gpus
    assert all(x["p95_wait_min"] > 60 for x in r.waits if x["gpus"] < r.training_gpus)
    assert r.training_gpus >= 3  # 55 GPU-hours a day cannot run on fewer
    assert any("simulator" in line for line in r.why)


def test_below_a_node_the_sizes_tried_step_by_a_runs_gpus():
    """Issue 71: with 4-GPU runs it tried 4, 5 and 6 GPUs, with the same waits (one run at a time)."""
    w = Workload(**IMAGENET, hours=1, images_per_gpu=2900, users=1, runs_per_user_day=1, wait_minutes=0.001,
                 gpus_per_node=16)
    r = size(w)
    below = [x["gpus"] for x in r.waits if x["gpus"] < 16]
    assert r.job_gpus > 1 and below and all(g % r.job_gpus == 0 for g in below), (r.job_gpus, r.waits)


def test_the_reasons_count_in_words_and_give_the_tables_figures():
    r = size(Workload(**IMAGENET, hours=24, images_per_gpu=2900, users=1, runs_per_user_day=1, simulate=False))
    said = " ".join(r.why)
    assert "1 user x 1 run a day" in said and "(s)" not in said and "at least 1 GPU to keep up" in said, said
    assert f"{r.read_gb_s:.2f} GB/s" in said


def test_serving_and_nodes():
    r = size(Workload(**IMAGENET, hours=2, images_per_gpu=1400, inference_rps=9000, rps_per_gpu=4000,
                      simulate=False))
    assert r.inference_gpus == 3 and r.gpus == r.training_gpus + 3 and r.nodes == -(-r.gpus // 8)
    assert r.training_gpus % 8 == 0  # more than a node's worth comes in whole nodes


@pytest.mark.parametrize("bad, says", [({"images": 0}, "--images"), ({"scaling": 1.5}, "--scaling"),
                                       ({"inference_rps": 10}, "--rps-per-gpu")])
def test_bad_input_says_what_to_fix(bad, says):
    with pytest.raises(InvalidRequest) as e:
        size(Workload(**{**IMAGENET, "hours": 8, "images_per_gpu": 1400, "simulate": False, **bad}))
    assert says in str(e.value)


def test_absurd_or_infinite_figures_are_refused_with_what_to_check():
    for bad in ({"hours": 5e-324}, {"images_per_gpu": 5e-324}, {"epochs": 1e300, "images": 10**11}):
        with pytest.raises(InvalidRequest, match="more than 10,000,000 GPUs"):
            size(Workload(**{**IMAGENET, "hours": 24, "images_per_gpu": 2900, **bad}))
    with pytest.raises(InvalidRequest, match="serving would need"):
        size(Workload(**IMAGENET, hours=24, images_per_gpu=2900, inference_rps=1e9, rps_per_gpu=1e-3))

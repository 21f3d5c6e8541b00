"""RoundCache (scheduler/round_cache.py) is an optimization only: rounds decided with it are
the rounds decided without it, through jobs that come and go, nodes that fall sick and come
back, a GPU cordoned, a new plan, queues whose keys age; and the simulator's figures are the
same with it switched off."""

import random
from dataclasses import replace

import pytest

from deeppod.scheduler import Plan, PlanNode, RunningJob, schedule
from deeppod.scheduler.round_cache import RoundCache
from deeppod.scheduler.simulator import SimConfig, Simulator, load_trace, proportional_plan
from tests.scheduler.synthetic import build
from tests.scheduler.test_simulator import PHILLY


def rounds(seed: int, steps: int = 12):
    """Snapshots of a cluster as rounds go by: each step some jobs end, some start (their rows
    kept as objects, as the simulator keeps them), the clock moves, and now and then a node
    or GPU falls sick, recovers, or the plan changes."""
    rng = random.Random(seed)
    snap = build(300, 32, seed=seed)
    running = list(snap.running)
    for step in range(steps):
        ended = rng.sample(running, k=min(len(running), rng.randint(0, 6)))
        running = [j for j in running if j not in ended]
        if ended:  # a job that ended makes room for a stopping one, or a resized one: new rows
            j = ended[0]
            running.append(replace(j, id=j.id + 10**7, stopping=rng.random() < 0.5, started_at=snap.now))
        if rng.random() < 0.3 and running:  # a job's row changes (it started stopping): a new object
            k = rng.randrange(len(running))
            running[k] = replace(running[k], stopping=True)
        nodes = list(snap.nodes)
        if step == 4:
            nodes[3] = replace(nodes[3], healthy=False)
        if step == 6:
            nodes[3] = replace(nodes[3], healthy=True)
            nodes[5] = replace(nodes[5], sick_gpus=(0,))
        if step == 8:
            nodes[5] = replace(nodes[5], sick_gpus=())
        plan = snap.plan
        if step == 9:
            plan = Plan(tuple(replace(t, guaranteed=t.guaranteed + 1) for t in plan.tenants) + (PlanNode("extra", 4),))
        queued = snap.queued[rng.randint(0, 20):] if step % 3 else snap.queued
        snap = replace(snap, nodes=tuple(nodes), running=tuple(running), queued=queued, plan=plan,
                       now=snap.now + rng.choice([0.5, 30.0, 700.0]))
        yield snap


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rounds_with_the_cache_decide_what_rounds_without_it_do(seed):
    cache = RoundCache()
    for snap in rounds(seed):
        assert schedule(snap, cache) == schedule(snap)
    assert cache.rebuilds >= 3 and cache.updates >= 3  # health and plan changes rebuilt it; the rest updated it


def test_a_running_job_kept_as_a_row_gains_service_with_time():
    from deeppod.scheduler.snapshot import attained_at

    job = RunningJob(1, "a", build(0, 1).running[0].placement, 1, attained=100.0, attained_since=50.0)
    assert attained_at(job, 50.0) == 100.0 and attained_at(job, 40.0) == 100.0
    assert attained_at(job, 60.0) == 100.0 + 10.0 * job.workers
    assert attained_at(replace(job, attained_since=None), 1e9) == 100.0  # as of the snapshot


@pytest.mark.skipif(not PHILLY.exists(), reason="the shared Philly trace is not beside the project")
def test_the_simulator_gives_the_same_figures_with_the_cache_switched_off():
    trace = load_trace(PHILLY, limit=300)
    plan = proportional_plan(trace, 32)
    on, off = (Simulator(trace, plan, SimConfig(nodes=4, elastic_fraction=0.3, round_cache=c)).run()
               for c in (True, False))
    timing = {"wall_seconds", "round_ms_avg", "round_ms_p50", "round_ms_p95", "round_ms_p99", "round_ms_max"}
    assert {k: v for k, v in on.items() if k not in timing} == {k: v for k, v in off.items() if k not in timing}
    assert on["preemptions"] > 0 and on["resizes"] > 0  # reclaim and elastic paths were taken


def test_the_kept_free_pool_is_the_pool_a_round_would_build_and_places_alike():
    """Node rows change between rounds (GPUs taken and freed, a node down and up): the pool the
    cache hands out has the fresh pool's free GPUs and its buckets in the same order (placement
    takes a bucket's first node in that order), and the same placements follow from it."""
    from deeppod.scheduler import NodeState
    from deeppod.scheduler.pool import FreePool

    rng = random.Random(5)
    nodes = [NodeState(f"n{i}", tuple(range(8)), 64.0, 1 << 20, True, 8) for i in range(300)]
    cache = RoundCache()
    for _ in range(40):
        for i in rng.sample(range(len(nodes)), 25):
            free = tuple(sorted(rng.sample(range(8), rng.randint(0, 8))))
            nodes[i] = replace(nodes[i], free_gpus=free, healthy=rng.random() > 0.05)
        kept, healthy, sick = cache.pool(tuple(nodes))
        fresh = FreePool(tuple(nodes))
        assert kept.free == fresh.free and kept.total_free == fresh.total_free
        assert healthy == {n.name for n in nodes if n.healthy} and not sick
        assert [list(b) for b in kept.buckets if b] == [list(b) for b in fresh.buckets if b]
        for gpw, workers in ((1, 3), (2, 2), (8, 1), (4, 5), (1, 40)):
            assert kept.place(workers, gpw) == fresh.place(workers, gpw)
        assert kept.free == fresh.free


def test_what_the_cache_knows_of_a_tenants_jobs_holds_only_until_time_or_a_change_moves_it():
    """The cache remembers, per tenant, when its running jobs could first be taken by least
    attained service, their lowest priority, and how many GPUs its queue's head class needs;
    the rows stay the same objects round after round while the clock moves. A job that grows
    old enough and served enough is taken at the first round it may be, and a new head of a
    higher priority preempts at once: with the cache as without it."""
    from deeppod.scheduler import Config, NodeState, PendingJob, Snapshot, WorkerPlacement

    cfg = Config(las_thresholds=(3600.0, 36000.0), min_run_before_las_preempt=600.0)
    nodes = (NodeState("n", (), 64.0, 1 << 20, True, total_gpus=2),)
    mine = [RunningJob(i, "a", (WorkerPlacement(0, "n", (i - 1,), 0.0, 0),), 1, 1, 1, 0, True, 1000.0,
                       attained=1000.0 * i, attained_since=1000.0) for i in (1, 2)]
    head = PendingJob(10, "a", 1, 1, 0.0, 0, 0, 900.0)
    cache = RoundCache()
    taken_at = None
    # job 2 reaches 3,600 GPU-seconds at 2,600 s; both have run 600 s at 1,600 s
    for now in (1000.0, 1500.0, 1599.0, 2000.0, 2599.0, 2600.5, 2700.0):
        s = Snapshot(nodes, (head,), tuple(mine), Plan(), now, cfg)
        d = schedule(s, cache)
        assert d == schedule(s)
        if d.preempts and taken_at is None:
            taken_at = now
            assert [p.job_id for p in d.preempts] == [2]
            assert d.preempts[0].reason.startswith("least attained service")
    assert taken_at == 2600.5
    # the same rows, a head of a higher priority: priority preemption, not held back by what was known
    urgent = PendingJob(11, "a", 1, 1, 0.0, 0, 5, 2700.0)
    s = Snapshot(nodes, (head, urgent), tuple(mine), Plan(), 2700.0, cfg)
    d = schedule(s, cache)
    assert d == schedule(s) and d.preempts and "higher priority" in d.preempts[0].reason

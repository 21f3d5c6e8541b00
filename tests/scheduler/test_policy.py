"""The policy, one round at a time, with no processes or DB."""

from deeppod.scheduler import NodeState, PendingJob, Snapshot, schedule
from deeppod.scheduler.placement import place


def node(name, gpus=8, cpus=64.0, mem=1 << 20, healthy=True):
    return NodeState(name, tuple(range(gpus)), cpus, mem, healthy)


def job(id, workers=1, gpus=1, priority=0, t=0.0, cpus=1.0, mem=0):
    return PendingJob(id, "t", workers, gpus, cpus, mem, priority, t)


def test_gang_start_all_or_nothing():
    snap = Snapshot((node("a", gpus=2),), (job(1, workers=3),))
    assert schedule(snap) == []
    snap = Snapshot((node("a", gpus=3),), (job(1, workers=3),))
    [start] = schedule(snap)
    assert [w.gpus for w in start.placement] == [(0,), (1,), (2,)]


def test_packs_on_fewest_nodes_and_orders_ranks_node_by_node():
    nodes = (node("a", gpus=2), node("b", gpus=8), node("c", gpus=4))
    [start] = schedule(Snapshot(nodes, (job(1, workers=4),)))
    assert {w.node for w in start.placement} == {"c"}  # best fit: the 4-GPU node, keeps b whole
    [start] = schedule(Snapshot(nodes, (job(1, workers=11),)))
    assert [w.node for w in start.placement] == ["b"] * 8 + ["c"] * 3
    assert [w.rank for w in start.placement] == list(range(11))


def test_no_gpu_is_given_twice():
    nodes = (node("a", gpus=4),)
    starts = schedule(Snapshot(nodes, (job(1, workers=2), job(2, workers=2, t=1))))
    gpus = [g for s in starts for w in s.placement for g in w.gpus]
    assert sorted(gpus) == [0, 1, 2, 3]


def test_priority_then_submit_time():
    nodes = (node("a", gpus=1),)
    [start] = schedule(Snapshot(nodes, (job(1, t=0), job(2, t=1, priority=5), job(3, t=2, priority=5))))
    assert start.job_id == 2


def test_head_of_queue_is_not_overtaken():
    nodes = (node("a", gpus=2),)
    starts = schedule(Snapshot(nodes, (job(1, workers=4, t=0), job(2, workers=1, t=1))))
    assert starts == []


def test_unhealthy_nodes_and_cpu_memory_limits():
    nodes = (node("sick", gpus=8, healthy=False), node("ok", gpus=8, cpus=2.0, mem=1000))
    assert schedule(Snapshot(nodes, (job(1, workers=3, cpus=1.0),))) == []
    assert schedule(Snapshot(nodes, (job(1, workers=2, cpus=1.0, mem=600),))) == []
    [start] = schedule(Snapshot(nodes, (job(1, workers=2, cpus=1.0, mem=500),)))
    assert {w.node for w in start.placement} == {"ok"}


def test_cpu_only_jobs_use_no_gpus():
    placed = place(job(1, workers=2, gpus=0), (node("a", gpus=0, cpus=4.0),))
    assert placed is not None
    placement, nodes = placed
    assert all(w.gpus == () for w in placement)
    assert nodes[0].free_cpus == 2.0

"""The multi-tenant policy, one round at a time, with no processes or DB."""

from deeppod.scheduler import (
    Config,
    NodeState,
    PendingJob,
    Plan,
    PlanNode,
    RunningJob,
    Snapshot,
    WorkerPlacement,
    schedule,
)


def node(name="n", gpus=8, cpus=64.0, mem=1 << 20, healthy=True, used=(), gmem=0):
    free = tuple(g for g in range(gpus) if g not in used)
    return NodeState(name, free, cpus, mem, healthy, total_gpus=gpus, gpu_memory_mb=gmem)


def job(id, tenant="a", workers=1, gpus=1, priority=0, t=0.0, max_workers=None, cpus=0.0, mem=0, **kw):
    return PendingJob(id, tenant, workers, gpus, cpus, mem, priority, t, max_workers=max_workers, **kw)


def running(id, tenant, gpus_list, node="n", gpw=1, min_workers=None, max_workers=None, priority=0, started=0.0,
            ckpt=None, preemptible=True, stopping=False, gmem=0):
    placement = tuple(WorkerPlacement(r, node, tuple(g), 0.0, 0) for r, g in enumerate(gpus_list))
    n = len(placement)
    return RunningJob(id, tenant, placement, gpw, min_workers or n, max_workers or n, priority, preemptible,
                      started, ckpt, stopping, gpu_memory_mb=gmem)


def plan(*nodes):
    return Plan(tuple(nodes))


def snap(nodes, queued=(), running_=(), plan_=Plan(), now=1000.0, **cfg):
    return Snapshot(tuple(nodes), tuple(queued), tuple(running_), plan_, now, Config(**cfg))


def started(decisions):
    return {s.job_id: s for s in decisions.starts}


# -- gang start and placement --------------------------------------------------------

def test_gang_start_all_or_nothing():
    assert schedule(snap([node(gpus=2)], [job(1, workers=3)])).starts == []
    [s] = schedule(snap([node(gpus=3)], [job(1, workers=3)])).starts
    assert [w.gpus for w in s.placement] == [(0,), (1,), (2,)]


def test_packs_on_fewest_nodes_and_orders_ranks_node_by_node():
    nodes = [node("a", gpus=2), node("b", gpus=8), node("c", gpus=4)]
    [s] = schedule(snap(nodes, [job(1, workers=4)])).starts
    assert {w.node for w in s.placement} == {"c"}  # best fit keeps b whole for big jobs
    [s] = schedule(snap(nodes, [job(1, workers=11)])).starts
    assert [w.node for w in s.placement] == ["b"] * 8 + ["c"] * 3
    assert [w.rank for w in s.placement] == list(range(11))


def test_multi_gpu_workers_stay_on_one_node_each():
    nodes = [node("a", gpus=8, used=(0, 1, 2)), node("b", gpus=8)]
    [s] = schedule(snap(nodes, [job(1, workers=2, gpus=4)])).starts
    assert {w.node for w in s.placement} == {"b"} and [w.gpus for w in s.placement] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_unhealthy_nodes_get_nothing_and_their_jobs_are_requeued():
    nodes = [node("sick", healthy=False), node("ok", gpus=2)]
    d = schedule(snap(nodes, [job(1, workers=3)], [running(9, "a", [(0,)], node="sick")]))
    assert d.starts == []
    assert [(p.job_id, "unhealthy" in p.reason) for p in d.preempts] == [(9, True)]


def test_cpu_and_memory_requests_limit_placement():
    nodes = [node("x", gpus=8, cpus=2.0, mem=1000)]
    assert schedule(snap(nodes, [job(1, workers=3, cpus=1.0)])).starts == []
    assert schedule(snap(nodes, [job(1, workers=2, cpus=1.0, mem=600)])).starts == []
    assert len(schedule(snap(nodes, [job(1, workers=2, cpus=1.0, mem=500)])).starts) == 1


def test_cpu_only_jobs_run_when_all_gpus_are_busy():
    nodes = [node(gpus=1, used=(0,), cpus=4.0)]
    d = schedule(snap(nodes, [job(1, gpus=0, cpus=1.0)], [running(9, "a", [(0,)])]))
    assert [s.job_id for s in d.starts] == [1]


# -- borrowing, lend limits, max ---------------------------------------------------------

def test_idle_gpus_are_lent_to_a_tenant_with_demand():
    p = plan(PlanNode("a", guaranteed=4), PlanNode("b", guaranteed=4))
    d = schedule(snap([node(gpus=8)], [job(1, "b", workers=8)], plan_=p))
    [s] = d.starts
    assert len(s.placement) == 8 and "borrowing 4" in s.reason


def test_without_a_plan_a_start_borrows_from_nobody():
    d = schedule(snap([node(gpus=8)], [job(1, "b", workers=2)]))
    [s] = d.starts
    assert "borrowing" not in s.reason and "no plan guarantees them" in s.reason, s.reason


def test_max_caps_borrowing():
    p = plan(PlanNode("a", guaranteed=4), PlanNode("b", guaranteed=2, max=4))
    d = schedule(snap([node(gpus=8)], [job(1, "b", workers=2), job(2, "b", workers=2, t=1), job(3, "b", workers=2,
                                                                                                t=2)],
                      plan_=p))
    assert sorted(started(d)) == [1, 2]
    assert any(w.job_id == 3 and "at its max" in w.reason for w in d.waits)


def test_max_applies_to_the_whole_subtree():
    org = PlanNode("org", guaranteed=2, max=3, children=(PlanNode("x", guaranteed=1), PlanNode("y", guaranteed=1)))
    d = schedule(snap([node(gpus=8)], [job(1, "x", workers=2), job(2, "y", workers=2, t=1)], plan_=plan(org)))
    assert sum(len(s.placement) for s in d.starts) <= 3


def test_lend_limit_keeps_part_of_an_idle_guarantee_unlent():
    p = plan(PlanNode("a", guaranteed=6, lend_limit=2), PlanNode("b", guaranteed=2))
    d = schedule(snap([node(gpus=8)], [job(1, "b", workers=8)] + [job(i, "b", t=i) for i in range(2, 10)], plan_=p))
    assert sum(len(s.placement) for s in d.starts) == 4  # its own 2 + the 2 that a lends


def test_surplus_is_shared_by_weight_when_the_plan_says_share():
    p = Plan((PlanNode("a", weight=3), PlanNode("b", weight=1)), surplus="share")
    queued = [job(i, "a", t=i) for i in range(8)] + [job(100 + i, "b", t=i) for i in range(8)]
    d = schedule(snap([node(gpus=8)], queued, plan_=p))
    by = {"a": 0, "b": 0}
    for s in d.starts:
        by["a" if s.job_id < 100 else "b"] += 1
    assert by == {"a": 6, "b": 2}


def test_surplus_goes_to_the_least_attained_then_earliest_job_whoever_s_it_is():
    # a and b both run at their guarantee of 1; 4 GPUs are idle. By default they go to the
    # waiting jobs of the lowest service class, then the earliest submitted, whoever's:
    # a's 2, 3, 4 and b's 10; a's job 1 has run 10 GPU-hours (class 1) and waits.
    p = plan(PlanNode("a", guaranteed=1), PlanNode("b", guaranteed=1))
    runs = [running(50, "a", [(0,)]), running(51, "b", [(1,)])]
    queued = [job(1, "a", t=1, attained=36000.0, queued_at=990.0), job(2, "a", t=2), job(3, "a", t=3),
              job(4, "a", t=4), job(10, "b", t=10), job(11, "b", t=11), job(12, "b", t=12)]
    d = schedule(snap([node(gpus=6, used=(0, 1))], queued, runs, plan_=p))
    assert sorted(started(d)) == [2, 3, 4, 10]
    assert all("borrowing" in s.reason for s in d.starts)
    # with surplus: share, each tenant gets half of the idle GPUs (equal weights), in its own order
    d = schedule(snap([node(gpus=6, used=(0, 1))], queued, runs, plan_=Plan(p.tenants, surplus="share")))
    assert sorted(started(d)) == [2, 3, 10, 11]


# -- reclaim ---------------------------------------------------------------------------

def test_reclaim_by_shrinking_an_elastic_job_first():
    p = plan(PlanNode("a", guaranteed=2), PlanNode("b", guaranteed=2))
    b_elastic = running(1, "b", [(g,) for g in range(4)], min_workers=1, max_workers=4)
    b_plain = running(2, "b", [], started=900)  # nothing: b holds all 4 through the elastic job
    d = schedule(snap([node(gpus=4, used=(0, 1, 2, 3))], [job(10, "a", workers=2)], [b_elastic], plan_=p))
    assert d.preempts == []
    [r] = d.resizes
    assert (r.job_id, r.workers) == (1, 2) and "reclaim for tenant a" in r.reason
    del b_plain


def test_reclaim_by_preempting_the_job_that_loses_least():
    p = plan(PlanNode("a", guaranteed=2), PlanNode("b", guaranteed=0))
    old_ckpt = running(1, "b", [(0,), (1,)], started=0, ckpt=100)  # 900 s of work since its checkpoint
    fresh_ckpt = running(2, "b", [(2,), (3,)], started=0, ckpt=990)  # 10 s since its checkpoint
    d = schedule(snap([node(gpus=4, used=(0, 1, 2, 3))], [job(10, "a", workers=2)], [old_ckpt, fresh_ckpt], plan_=p))
    assert [x.job_id for x in d.preempts] == [2]
    assert "below" in d.preempts[0].reason or "reclaim" in d.preempts[0].reason


def test_victim_order_priority_then_most_recently_started():
    p = plan(PlanNode("a", guaranteed=1), PlanNode("b"))
    jobs = [running(1, "b", [(0,)], started=500, priority=5), running(2, "b", [(1,)], started=100),
            running(3, "b", [(2,)], started=600)]
    d = schedule(snap([node(gpus=3, used=(0, 1, 2))], [job(10, "a")], jobs, plan_=p, now=1000.0))
    # same loss (no checkpoints: progress since start differs) -> least progress is job 3
    assert [x.job_id for x in d.preempts] == [3]


def test_no_tenant_is_pushed_below_its_guarantee():
    p = plan(PlanNode("a", guaranteed=2), PlanNode("b", guaranteed=2))
    jobs = [running(1, "b", [(0,), (1,)])]  # b uses exactly its guarantee
    d = schedule(snap([node(gpus=4, used=(0, 1, 2, 3))], [job(10, "a", workers=2)],
                      jobs + [running(2, "a", [(2,), (3,)])], plan_=p))
    assert d.preempts == [] and d.resizes == []


def test_reclaim_is_not_repeated_while_gpus_are_already_returning():
    p = plan(PlanNode("a", guaranteed=2), PlanNode("b"))
    jobs = [running(1, "b", [(0,), (1,)], stopping=True), running(2, "b", [(2,), (3,)])]
    d = schedule(snap([node(gpus=4, used=(0, 1, 2, 3))], [job(10, "a", workers=2)], jobs, plan_=p))
    assert d.preempts == [] and d.resizes == []


def test_reclaim_earmarks_free_gpus_for_several_jobs_and_still_evicts_for_the_next():
    # a is 3 below its guarantee with 1-GPU jobs queued, one GPU is free and b borrows 3: the
    # free GPU goes to a's first job and a borrower is evicted for its second in the same
    # round (before: only the free GPU, one job a round while a stayed below its guarantee)
    p = plan(PlanNode("a", guaranteed=4), PlanNode("b", guaranteed=0))
    jobs = [running(1, "a", [(0,)]), running(2, "b", [(1,)]), running(3, "b", [(2,)]), running(4, "b", [(3,)])]
    queued = [job(10, "a", t=1), job(11, "a", t=2), job(12, "a", t=3)]
    d = schedule(snap([node(gpus=5, used=(0, 1, 2, 3))], queued, jobs, plan_=p))
    assert list(started(d)) == [10]
    assert len(d.preempts) == 1 and d.preempts[0].job_id in (2, 3, 4) and "job 11 waits" in d.preempts[0].reason
    before = schedule(snap([node(gpus=5, used=(0, 1, 2, 3))], queued, jobs, plan_=p, earmark_free=False))
    assert list(started(before)) == [10] and before.preempts == []


def test_reclaim_takes_the_borrowing_job_when_the_cheaper_small_one_would_not_be_enough():
    # b borrows 2 GPUs beyond its guarantee of 1 through job 2; job 1 runs within it. Taking
    # job 1 first (least work lost) leaves b's budget too small for job 2: a never got in.
    p = plan(PlanNode("a", guaranteed=2), PlanNode("b", guaranteed=1))
    jobs = [running(1, "b", [(0,)], node="x", started=0), running(2, "b", [(0,), (1,)], node="y", started=0)]
    nodes = [node("x", gpus=1, used=(0,)), node("y", gpus=2, used=(0, 1))]
    d = schedule(snap(nodes, [job(10, "a", workers=2)], jobs, plan_=p))
    assert [x.job_id for x in d.preempts] == [2] and "reclaim for tenant a" in d.preempts[0].reason


def test_reclaim_takes_a_borrowing_job_that_takes_its_tenant_below_the_guarantee_when_nothing_else_does():
    # b (guarantee 2) runs job 1 within it and job 2 (3 GPUs) partly beyond: only job 2 frees
    # enough for a, though b drops to 1 GPU and will ask for its own back
    p = plan(PlanNode("a", guaranteed=2), PlanNode("b", guaranteed=2))
    jobs = [running(1, "b", [(3,)], started=0), running(2, "b", [(0,), (1,), (2,)], started=1)]
    d = schedule(snap([node(gpus=4, used=(0, 1, 2, 3))], [job(10, "a", workers=2)], jobs, plan_=p))
    assert [x.job_id for x in d.preempts] == [2]


def _scattered(now=5000.0, started=0.0, **cfg):
    """4 nodes of 8 GPUs; tenant b runs one 1-GPU job on each (within its guarantee), so 28
    GPUs are free but no node is whole; tenant a (below its guarantee) waits with 2 x 8."""
    p = plan(PlanNode("a", guaranteed=16), PlanNode("b", guaranteed=16))
    nodes = [node(n, used=(0,)) for n in "wxyz"]
    jobs = [running(i, "b", [(0,)], node=n, started=started) for i, n in enumerate("wxyz", 1)]
    return snap(nodes, [job(10, "a", workers=2, gpus=8, t=0.0)], jobs, plan_=p, now=now, **cfg)


def test_jobs_are_moved_off_nodes_to_clear_whole_nodes_for_a_gang_within_its_guarantee():
    d = schedule(_scattered())
    assert d.starts == [] and len(d.preempts) == 2
    assert all("moved to free GPUs on other nodes" in x.reason and "tenant a" in x.reason for x in d.preempts)
    # the next round: the moved jobs are queued again, their nodes are whole
    moved = {x.job_id for x in d.preempts}
    left = [j for j in _scattered().running if j.id not in moved]
    cleared = {j.placement[0].node for j in _scattered().running if j.id in moved}
    nodes = [node(n, used=() if n in cleared else (0,)) for n in "wxyz"]
    queued = [job(10, "a", workers=2, gpus=8, t=0.0)] + [job(i, "b", t=0.0, queued_at=5010.0) for i in moved]
    d2 = schedule(snap(nodes, queued, left, plan_=_scattered().plan, now=5010.0))
    s = started(d2)
    assert {w.node for w in s[10].placement} == cleared
    assert all(s[i].placement[0].node not in cleared for i in moved)  # they start again elsewhere


def test_a_node_is_cleared_by_evicting_what_borrows_there_and_moving_the_rest():
    # a (guarantee 4) waits for one 4-GPU worker. x holds b's 2-worker job (within b's
    # guarantee, its other worker on y) and c's borrowed 1-GPU job; y and z are just as busy
    p = plan(PlanNode("a", guaranteed=4), PlanNode("b", guaranteed=8), PlanNode("c"))
    nodes = [node("x", gpus=4, used=(0, 1)), node("y", gpus=4, used=(0, 1, 2, 3)), node("z", gpus=4, used=(0, 1, 2))]
    spread = RunningJob(1, "b", (WorkerPlacement(0, "x", (0,), 0.0, 0), WorkerPlacement(1, "y", (0,), 0.0, 0)), 1, 2, 2)
    jobs = [spread, running(2, "b", [(0,), (1,), (2,)], node="z"), running(3, "c", [(1,)], node="x", started=10),
            running(4, "c", [(1,), (2,), (3,)], node="y", started=10)]
    d = schedule(snap(nodes, [job(10, "a", gpus=4)], jobs, plan_=p, now=5000.0))
    why = {x.job_id: x.reason for x in d.preempts}
    assert set(why) == {1, 3} and why[1].startswith("moved") and why[3].startswith("reclaim for tenant a")
    # next round: x is whole; the moved job starts on y and z, a's worker on x
    nodes = [node("x", gpus=4), node("y", gpus=4, used=(1, 2, 3)), node("z", gpus=4, used=(0, 1, 2))]
    queued = [job(10, "a", gpus=4), job(1, "b", workers=2, queued_at=5010.0), job(3, "c", queued_at=5010.0)]
    d2 = started(schedule(snap(nodes, queued, [jobs[1], jobs[3]], plan_=p, now=5010.0)))
    assert [w.node for w in d2[10].placement] == ["x"]
    assert sorted(w.node for w in d2[1].placement) == ["y", "z"]


def test_no_moves_for_a_gang_that_just_arrived_or_off_young_runs_or_when_turned_off():
    assert schedule(_scattered(now=200.0)).preempts == []  # waited less than reserve_after_seconds
    assert schedule(_scattered(started=4500.0)).preempts == []  # ran less than min_run_before_las_preempt
    assert schedule(_scattered(defragment=False)).preempts == []


def test_no_moves_when_the_moved_jobs_would_find_no_room():
    p = plan(PlanNode("a", guaranteed=16), PlanNode("b", guaranteed=16))
    # 2 nodes, 7 GPUs used on each: clearing one would need 7 free GPUs elsewhere
    nodes = [node(n, used=tuple(range(7))) for n in "xy"]
    jobs = [running(ord(n), "b", [tuple(range(7))], node=n, gpw=7) for n in "xy"]
    d = schedule(snap(nodes, [job(10, "a", workers=1, gpus=8)], jobs, plan_=p, now=5000.0))
    assert d.preempts == []


def test_whole_nodes_reclaimed_for_a_gang_are_held_for_it_not_only_counted():
    # a (below its guarantee) can start 2 x 8 on nodes w and x. c is further below its own
    # guarantee, so it starts first, with an 8-GPU job that borrows (too big to reclaim for);
    # 8 GPUs beyond those counted for a are free (4 on y, 4 on z), so by best fit alone c's
    # job would land on w
    p = plan(PlanNode("a", guaranteed=17), PlanNode("b", guaranteed=8), PlanNode("c", guaranteed=4))
    nodes = [node("w"), node("x"), node("y", used=(0, 1, 2, 3)), node("z", used=(0, 1, 2, 3)),
             node("v", gpus=1, used=(0,))]
    jobs = [running(1, "b", [(0, 1, 2, 3)], node="y", gpw=4), running(2, "b", [(0, 1, 2, 3)], node="z", gpw=4),
            running(3, "a", [(0,)], node="v")]
    queued = [job(10, "a", workers=2, gpus=8), job(20, "c", workers=1, gpus=8)]
    d = schedule(snap(nodes, queued, jobs, plan_=p))
    assert set(started(d)) == {10} and {w.node for w in started(d)[10].placement} == {"w", "x"}
    old = schedule(snap(nodes, queued, jobs, plan_=p, defragment=False))
    assert set(started(old)) == {20}  # what a count of GPUs allowed: a's gang is left waiting


def test_non_preemptible_jobs_are_never_victims():
    p = plan(PlanNode("a", guaranteed=2), PlanNode("b"))
    jobs = [running(1, "b", [(0,), (1,)], preemptible=False)]
    d = schedule(snap([node(gpus=2, used=(0, 1))], [job(10, "a", workers=2)], jobs, plan_=p))
    assert d.preempts == [] and any(w.job_id == 10 for w in d.waits)


def test_fair_share_contention_shrinks_but_never_preempts():
    p = plan(PlanNode("a"), PlanNode("b"))
    elastic = running(1, "b", [(g,) for g in range(8)], min_workers=2, max_workers=8, started=0)
    plain = running(2, "b", [], started=0)
    d = schedule(snap([node(gpus=8, used=tuple(range(8)))], [job(10, "a", workers=2)], [elastic], plan_=p))
    assert d.preempts == []
    assert [(r.job_id, r.workers) for r in d.resizes] == [(1, 6)]
    del plain


# -- priority, aging, reservation -----------------------------------------------------------

def test_priority_then_submit_time_within_a_tenant():
    d = schedule(snap([node(gpus=1)], [job(1, t=0), job(2, t=1, priority=5), job(3, t=2, priority=5)], now=3))
    assert list(started(d)) == [2]


def test_higher_priority_preempts_lower_in_the_same_tenant():
    d = schedule(snap([node(gpus=2, used=(0, 1))], [job(10, "a", workers=2, priority=10)],
                      [running(1, "a", [(0,), (1,)], priority=0)]))
    assert [x.job_id for x in d.preempts] == [1] and "higher priority" in d.preempts[0].reason


def test_equal_priority_does_not_preempt():
    d = schedule(snap([node(gpus=2, used=(0, 1))], [job(10, "a", workers=2)], [running(1, "a", [(0,), (1,)])]))
    assert d.preempts == []


def test_aging_lets_an_old_low_priority_job_go_first():
    queued = [job(1, priority=0, t=0.0), job(2, priority=2, t=5000.0)]
    assert list(started(schedule(snap([node(gpus=1)], queued, now=5001.0, aging_seconds=0)))) == [2]
    # after 3 aging periods the old job outranks the newer priority-2 job
    assert list(started(schedule(snap([node(gpus=1)], queued, now=5001.0, aging_seconds=1500)))) == [1]


def test_large_job_gets_a_reservation_and_small_jobs_backfill_elsewhere():
    nodes = [node("n1", gpus=8, used=(0, 1, 2, 3, 4, 5)), node("n2", gpus=8, used=(0, 1, 2, 3, 4, 5, 6, 7)),
             node("n3", gpus=8, used=(0, 1, 2, 3, 4, 5, 6))]
    others = [running(50, "z", [(g,) for g in range(6)], node="n1"), running(51, "z", [(g,) for g in range(8)],
                                                                             node="n2"),
              running(52, "z", [(g,) for g in range(7)], node="n3")]
    big = job(1, workers=8, t=0.0)
    smalls = [job(2, t=10.0), job(3, t=11.0)]
    d = schedule(snap(nodes, [big, *smalls], others, now=1000.0, reserve_after_seconds=300, grow=False))
    assert 1 not in started(d)
    assert any(w.job_id == 1 and "reserved" in w.reason for w in d.waits)
    # the big job holds n1 (the emptiest node); one small job backfills on n3's free GPU
    assert [(s.job_id, s.placement[0].node) for s in d.starts] == [(2, "n3")]


def test_without_the_wait_small_jobs_may_pass_a_blocked_large_one():
    nodes = [node("n1", gpus=8, used=(0, 1, 2, 3, 4, 5))]
    d = schedule(snap(nodes, [job(1, workers=8, t=990.0), job(2, t=995.0)], now=1000.0, reserve_after_seconds=300))
    assert list(started(d)) == [2]


# -- elastic ------------------------------------------------------------------------------

def test_elastic_job_starts_as_large_as_its_share_allows():
    p = plan(PlanNode("a"), PlanNode("b"))
    d = schedule(snap([node(gpus=8)], [job(1, "a", workers=2, max_workers=8), job(2, "b", workers=2, t=1)], plan_=p))
    sizes = {s.job_id: len(s.placement) for s in d.starts}
    assert sizes[2] == 2 and 2 <= sizes[1] <= 6


def test_elastic_job_grows_into_idle_gpus():
    d = schedule(snap([node(gpus=8, used=(0, 1))], [], [running(1, "a", [(0,), (1,)], min_workers=1, max_workers=8)]))
    assert [(r.job_id, r.workers) for r in d.resizes] == [(1, 8)]


def test_young_jobs_do_not_grow():
    d = schedule(snap([node(gpus=8, used=(0, 1))], [], [running(1, "a", [(0,), (1,)], min_workers=1, max_workers=8,
                                                                  started=990.0)], now=1000.0))
    assert d.resizes == []


def test_resize_target_is_honoured_on_restart():
    d = schedule(snap([node(gpus=8)], [job(1, workers=1, max_workers=8, resize_to=3)]))
    assert len(d.starts[0].placement) == 3


def test_a_failed_slot_is_avoided_on_retry():
    d = schedule(snap([node(gpus=2)], [job(1, avoid=frozenset({("n", 0)}))]))
    assert d.starts[0].placement[0].gpus == (1,)


def test_a_job_on_a_sick_gpu_is_requeued():
    n = NodeState("n", (1,), 64.0, 1 << 20, True, total_gpus=1, sick_gpus=(0,))
    d = schedule(snap([n], [], [running(9, "a", [(0,)])]))
    assert [(p.job_id, "GPU 0 of node n is unhealthy" in p.reason) for p in d.preempts] == [(9, True)]


# -- wait reasons name the short resource ----------------------------------------------

def waits(decisions):
    return {w.job_id: w.reason for w in decisions.waits}


def test_a_wait_for_cpus_says_cpus_not_nodes():
    # 2 cores, 4 GPUs, 2 GPUs in use by jobs that took 1 CPU each: a free GPU, no free CPU
    n = NodeState("n", (2, 3), 0.0, 1 << 20, True, total_gpus=4)
    reason = waits(schedule(snap([n], [job(1, cpus=1.0)])))[1]
    assert reason.startswith("not enough free CPUs") and "--cpus-per-worker" in reason


def test_a_wait_for_memory_says_memory():
    n = NodeState("n", (0, 1), 8.0, 1000, True, total_gpus=2)
    reason = waits(schedule(snap([n], [job(1, cpus=1.0, mem=4000)])))[1]
    assert reason.startswith("not enough free memory") and "1000 MiB free" in reason


def test_a_gang_split_over_nodes_says_gpus():
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    reason = waits(schedule(snap(nodes, [job(1, workers=1, gpus=3)])))[1]
    assert reason.startswith("no set of nodes has 1 x 3 free GPUs")


def test_a_cpu_only_job_that_does_not_fit_says_cpus():
    n = NodeState("n", (0,), 1.0, 1 << 20, True, total_gpus=1)
    reason = waits(schedule(snap([n], [job(1, workers=2, gpus=0, cpus=1.0)])))[1]
    assert reason.startswith("not enough free CPUs: 2 workers x 1 CPUs, 1 CPUs free")


# -- GPU memory requests ----------------------------------------------------------------------

G = 1024  # MiB


def test_a_gpu_memory_request_places_only_on_gpus_that_have_it():
    nodes = [node("small", gpus=4, gmem=16 * G), node("big", gpus=4, gmem=80 * G)]
    d = started(schedule(snap(nodes, [job(1, workers=2, gpu_memory_mb=40 * G)])))
    assert {w.node for w in d[1].placement} == {"big"}
    d = started(schedule(snap(nodes, [job(1, workers=2)])))
    assert {w.node for w in d[1].placement} == {"small"}  # without it: the first of the equally full nodes
    # a node whose GPUs' memory is not known (logical slots) takes any request
    d = started(schedule(snap([node("small", gmem=16 * G), node("slots")], [job(1, gpu_memory_mb=40 * G)])))
    assert d[1].placement[0].node == "slots"


def test_a_wait_for_big_gpus_says_gpu_memory():
    nodes = [node("small", gpus=4, gmem=16 * G), node("big", gpus=2, gmem=80 * G, used=(0, 1))]
    reason = waits(schedule(snap(nodes, [job(1, workers=2, gpu_memory_mb=40 * G)])))[1]
    assert reason.startswith(f"waiting for 2 GPUs with {40 * G} MiB each")
    # big GPUs free, but one per node: a worker of 2 does not fit, though 2 small ones are free together
    nodes = [node("small", gpus=2, gmem=16 * G)] + [node(f"big{i}", gpus=2, gmem=80 * G, used=(0,)) for i in (1, 2)]
    reason = waits(schedule(snap(nodes, [job(1, gpus=2, gpu_memory_mb=40 * G)])))[1]
    assert reason.startswith(f"no set of nodes has 1 x 2 free GPUs with {40 * G} MiB each at once")
    assert "2 of the 4 free GPUs have that much memory" in reason and "--gpu-memory" in reason


def test_reclaim_for_big_gpus_preempts_on_the_nodes_that_have_them():
    # 2 of 4 small GPUs are free, but a's job needs a big one: b's job on the big node goes,
    # not the one on the small node (a count of free GPUs would see room and take nothing)
    p = plan(PlanNode("a", guaranteed=2), PlanNode("b"))
    nodes = [node("small", gpus=4, gmem=16 * G, used=(0, 1)), node("big", gpus=2, gmem=80 * G, used=(0, 1))]
    jobs = [running(1, "b", [(0,), (1,)], node="small", started=0), running(2, "b", [(0, 1)], node="big", gpw=2,
                                                                                started=0)]
    d = schedule(snap(nodes, [job(10, "a", gpu_memory_mb=80 * G)], jobs, plan_=p, now=5000.0))
    assert [x.job_id for x in d.preempts] == [2] and "reclaim for tenant a" in d.preempts[0].reason
    # what a count saw: the job waits on 2 free GPUs that are too small, and nothing is reclaimed
    d = schedule(snap(nodes, [job(10, "a", gpu_memory_mb=0)], jobs, plan_=p, now=5000.0))
    assert d.preempts == [] and 10 in started(d)


def test_a_big_job_reserves_only_nodes_with_big_gpus():
    nodes = [node("small", gpus=8, gmem=16 * G), node("big", gpus=8, gmem=80 * G, used=(0, 1, 2, 3, 4, 5))]
    others = [running(50, "z", [(g,) for g in range(6)], node="big")]
    queued = [job(1, workers=4, t=0.0, gpu_memory_mb=80 * G), job(2, t=10.0, gpu_memory_mb=80 * G), job(3, t=11.0)]
    d = schedule(snap(nodes, queued, others, now=1000.0, reserve_after_seconds=300, grow=False))
    assert any(w.job_id == 1 and "reserved" in w.reason for w in d.waits)
    # the big node's 2 free GPUs are held for job 1: job 2 (big GPUs too) waits; job 3 goes to the small node
    assert [(s.job_id, s.placement[0].node) for s in d.starts] == [(3, "small")]


def test_the_count_of_free_gpus_with_a_memory_is_kept_through_takes_gives_and_copies():
    import random

    from deeppod.scheduler.pool import FreePool

    rng = random.Random(7)
    sizes = [0, 16 * G, 40 * G, 80 * G]
    pool = FreePool(tuple(node(f"n{i}", gpus=8, gmem=rng.choice(sizes)) for i in range(40)))

    def counted(p, gmem):
        return sum(len(f) for i, f in enumerate(p.free) if p.gpus_fit(i, gmem))

    for step in range(400):
        gmem = rng.choice([20 * G, 60 * G, 80 * G])
        assert pool.free_with(gmem) == counted(pool, gmem), step
        got = pool.place(rng.randint(1, 3), rng.choice([1, 2]), gmem=rng.choice([0, gmem]))
        if got and rng.random() < 0.5:
            pool.release(got[:1])
        if step % 50 == 0:
            pool = pool.copy()
    assert all(pool.free_with(g) == counted(pool, g) for g in (20 * G, 60 * G, 80 * G))
    assert pool.free_with(0) == pool.total_free


def test_an_elastic_job_grows_only_onto_gpus_with_its_memory():
    nodes = [node("small", gpus=4, gmem=16 * G), node("big", gpus=4, gmem=80 * G, used=(0, 1))]
    grows = RunningJob(**{**running(1, "a", [(0,), (1,)], node="big", max_workers=8, gmem=80 * G).__dict__,
                          "in_place": True})
    [r] = schedule(snap(nodes, [], [grows])).resizes
    assert (r.workers, {w.node for w in r.added}) == (4, {"big"})
    # a restart to a larger size: only if the big GPUs hold it (without the request it grows onto the small ones)
    nodes = [node("small", gpus=4, gmem=16 * G), node("big", gpus=2, gmem=80 * G, used=(0, 1))]
    big_only = running(1, "a", [(0,), (1,)], node="big", max_workers=4, gmem=80 * G)
    assert schedule(snap(nodes, [], [big_only])).resizes == []
    [r] = schedule(snap(nodes, [], [running(1, "a", [(0,), (1,)], node="big", max_workers=4)])).resizes
    assert r.workers == 4


# -- least attained service -----------------------------------------------------------------

def las(**kw):
    return dict(las_thresholds=(3600.0, 36000.0), min_run_before_las_preempt=600.0, **kw)


def long_running(id, tenant, gpus, attained, started=0.0, **kw):
    return RunningJob(**{**running(id, tenant, gpus, started=started, **kw).__dict__, "attained": attained})


def test_queue_order_is_priority_then_service_class_then_submit_time():
    queued = [job(1, t=0.0, attained=50_000.0), job(2, t=10.0, attained=5_000.0), job(3, t=20.0),
              job(4, t=30.0, priority=1, attained=50_000.0)]
    d = schedule(snap([node(gpus=1)], queued, now=100.0, **las(starve_after=1e9)))
    assert list(started(d)) == [4]
    d = schedule(snap([node(gpus=1)], queued[:3], now=100.0, **las(starve_after=1e9)))
    assert list(started(d)) == [3]  # class 0 first, though it came last


def test_a_new_job_preempts_a_long_one_of_its_tenant():
    d = schedule(snap([node(gpus=2, used=(0, 1))], [job(10, "a")],
                      [long_running(1, "a", [(0,)], 40_000.0), long_running(2, "a", [(1,)], 5_000.0)],
                      now=1000.0, **las()))
    assert [p.job_id for p in d.preempts] == [1]  # the one with most service, one GPU is enough
    assert "least attained service: job 10 of tenant a (class 0)" in d.preempts[0].reason


def test_a_burst_of_new_jobs_gets_room_in_one_round():
    longs = [long_running(i, "a", [(i - 1,)], 40_000.0 + i) for i in (1, 2, 3, 4)]
    burst = [job(10, "a", t=1.0), job(11, "a", t=2.0), job(12, "a", t=3.0), job(13, "a", t=4.0, attained=5_000.0)]
    d = schedule(snap([node(gpus=4, used=(0, 1, 2, 3))], burst, longs, now=1000.0, **las()))
    assert sorted(p.job_id for p in d.preempts) == [2, 3, 4]  # for the three of class 0; not for 13 (class 1)
    assert d.preempts[0].reason.startswith("least attained service: job 10 of tenant a (class 0) waits for 1 GPUs, "
                                           "with more jobs of its class behind it (3 GPUs in all)")
    one = schedule(snap([node(gpus=4, used=(0, 1, 2, 3))], burst, longs, now=1000.0, **las(las_jobs_per_round=1)))
    assert [p.job_id for p in one.preempts] == [4]
    # not enough victims for all: room for as many as there are
    d = schedule(snap([node(gpus=4, used=(0, 1, 2, 3))], burst,
                      longs[:2] + [long_running(i, "a", [(i - 1,)], 100.0) for i in (3, 4)], now=1000.0, **las()))
    assert sorted(p.job_id for p in d.preempts) == [1, 2]


def test_least_attained_spares_young_runs_same_class_and_higher_priority():
    young = schedule(snap([node(gpus=1, used=(0,))], [job(10, "a")], [long_running(1, "a", [(0,)], 40_000.0,
                                                                                   started=900.0)],
                          now=1000.0, **las()))
    same = schedule(snap([node(gpus=1, used=(0,))], [job(10, "a", attained=4_000.0)],
                         [long_running(1, "a", [(0,)], 5_000.0)], now=1000.0, **las(starve_after=1e9)))
    higher = schedule(snap([node(gpus=1, used=(0,))], [job(10, "a")],
                           [long_running(1, "a", [(0,)], 40_000.0, priority=3)], now=1000.0, **las()))
    assert young.preempts == same.preempts == higher.preempts == []


def test_least_attained_shrinks_an_elastic_victim_before_stopping_it():
    victim = RunningJob(**{**running(1, "a", [(0,), (1,), (2,), (3,)], min_workers=2, max_workers=4).__dict__,
                           "attained": 40_000.0, "in_place": True})
    d = schedule(snap([node(gpus=4, used=(0, 1, 2, 3))], [job(10, "a")], [victim], now=1000.0, **las()))
    assert d.preempts == [] and [(r.job_id, r.workers, r.in_place) for r in d.resizes] == [(1, 3, True)]


def test_least_attained_takes_only_borrowed_gpus_from_another_tenant():
    p = plan(PlanNode("a", guaranteed=2), PlanNode("b", guaranteed=2))
    # b runs 3 GPUs: 2 within its guarantee (started first), 1 borrowed
    b_jobs = [long_running(1, "b", [(0,)], 90_000.0, started=0.0), long_running(2, "b", [(1,)], 90_000.0, started=1.0),
              long_running(3, "b", [(2,)], 80_000.0, started=2.0)]
    a_job = long_running(4, "a", [(3,)], 100.0, started=3.0)
    d = schedule(snap([node(gpus=4, used=(0, 1, 2, 3))], [job(10, "a")], b_jobs + [a_job], p, now=1000.0, **las()))
    assert [x.job_id for x in d.preempts] == [3]  # the borrower, though 1 and 2 have run longer


def test_a_long_job_that_waited_long_enough_is_class_zero_again():
    from deeppod.scheduler.policy import waiting_class

    cfg = Config(**las(starve_factor=1.0, starve_after=1800.0))
    waited = job(1, attained=36_000.0 * 2, queued_at=0.0)  # 20 GPU-hours on 1 GPU
    assert waiting_class(waited, 3600.0 * 19, cfg) == 2
    assert waiting_class(waited, 3600.0 * 20, cfg) == 0  # waited as long as it ran
    assert waiting_class(job(2, attained=4000.0, queued_at=0.0), 1799.0, cfg) == 1  # at least starve_after


def test_an_in_place_elastic_job_grows_sooner_and_keeps_its_workers():
    still = RunningJob(**{**running(1, "a", [(0,), (1,)], max_workers=4, started=900.0).__dict__, "in_place": True})
    restart = running(2, "a", [(2,), (3,)], max_workers=4, started=900.0)
    d = schedule(snap([node(gpus=8, used=(0, 1, 2, 3))], [], [still, restart], now=1100.0,
                      min_run_before_resize=900.0))
    [r] = d.resizes  # 200 s is past the in-place window (30 x 5 s), not the restart one (900 s)
    assert (r.job_id, r.workers, r.in_place) == (1, 4, True)
    assert [w.rank for w in r.added] == [2, 3] and all(w.gpus[0] >= 4 for w in r.added)


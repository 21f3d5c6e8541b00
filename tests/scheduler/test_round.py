"""The round's phases one at a time: each reads the state the earlier ones left."""

import pytest

from deeppod.scheduler import PlanNode, schedule
from deeppod.scheduler.phases import (
    HANDED_OFF,
    candidates,
    fair_share,
    grow,
    hand_off,
    health,
    least_attained,
    priority,
    reclaim,
    starts,
)
from deeppod.scheduler.round_state import RoundState
from tests.scheduler.test_policy import job, las, long_running, node, plan, running, snap, started


def test_the_health_phase_alone_preempts_jobs_on_sick_nodes_and_nothing_else():
    sick = node("sick", healthy=False, used=(0,))
    st = RoundState.of(snap([sick, node("ok", gpus=2)], [job(5)], [running(1, "a", [(0,)], node="sick")]))
    health.run(st)
    assert [p.job_id for p in st.out.preempts] == [1] and st.gone == {1}
    assert st.out.starts == [] and st.out.waits == []  # starting is a later phase


def test_an_eviction_gives_the_gpus_back_to_the_tenant_accounting_once():
    p = plan(PlanNode("a", guaranteed=2), PlanNode("b", guaranteed=0))
    st = RoundState.of(snap([node(gpus=2, used=(0, 1))], [job(10, "a", workers=2)],
                    [running(1, "b", [(0,), (1,)], started=0)], plan_=p))
    health.run(st)
    candidates.run(st)
    assert st.tenants.usage["b"] == 2
    reclaim.run(st)
    assert [x.job_id for x in st.out.preempts] == [1] and st.leaving == {1}
    assert st.tenants.usage["b"] == 0 and st.victims["b"] == []
    assert 1 in st.borrowers and st.lost_own == set()  # b (guaranteed 0) lost a borrowed job, none of its own
    assert st.stopping_gpus == 2  # on their way back; the starts phase does not use them yet
    starts.run(st)
    assert st.out.starts == [] and "waiting for 2 GPUs" in st.out.waits[0].reason


def test_the_grow_phase_alone_grows_into_idle_gpus():
    st = RoundState.of(snap([node(gpus=4, used=(0,))], [], [running(1, "a", [(0,)], max_workers=4, started=0)],
                    min_run_before_resize=0))
    candidates.run(st)
    grow.run(st)
    assert [(x.job_id, x.workers) for x in st.out.resizes] == [(1, 4)]


def test_the_fair_share_phase_alone_shrinks_and_preempts_nothing():
    p = plan(PlanNode("a"), PlanNode("b"))
    elastic = running(1, "b", [(g,) for g in range(8)], min_workers=2, max_workers=8, started=0)
    st = RoundState.of(snap([node(gpus=8, used=tuple(range(8)))], [job(10, "a", workers=2)], [elastic], plan_=p))
    candidates.run(st)
    fair_share.run(st)
    assert st.out.preempts == [] and [(r.job_id, r.workers) for r in st.out.resizes] == [(1, 6)]
    assert st.out.starts == []  # the GPUs it frees are started on by a later phase


def test_the_priority_phase_alone_evicts_the_lower_priority_job_and_holds_its_gpus():
    st = RoundState.of(snap([node(gpus=2, used=(0, 1))], [job(10, "a", workers=2, priority=10)],
                            [running(1, "a", [(0,), (1,)])]))
    candidates.run(st)
    assert priority.enabled(st)
    priority.run(st)
    assert [x.job_id for x in st.out.preempts] == [1] and st.out.starts == []
    st = RoundState.of(snap([node(gpus=2, used=(0, 1))], [job(10, "a", workers=2, priority=10)],
                            [running(1, "a", [(0,), (1,)])], priority_preemption=False))
    assert not priority.enabled(st)


def test_the_least_attained_phase_alone_stops_the_long_runner_for_a_new_job():
    st = RoundState.of(snap([node(gpus=1, used=(0,))], [job(10, "a")], [long_running(1, "a", [(0,)], 40_000.0)],
                            now=1000.0, **las()))
    candidates.run(st)
    assert least_attained.enabled(st)
    least_attained.run(st)
    assert [x.job_id for x in st.out.preempts] == [1] and "least attained service" in st.out.preempts[0].reason


def test_the_configuration_orders_and_turns_off_phases_by_name():
    base = dict(nodes=[node(gpus=4, used=(0,))], queued=[], running_=[running(1, "a", [(0,)], max_workers=4)],
                min_run_before_resize=0)
    assert [(r.job_id, r.workers) for r in schedule(snap(**base)).resizes] == [(1, 4)]
    assert schedule(snap(**base, phases=("health", "candidates", "starts"))).resizes == []  # no grow phase
    with pytest.raises(ValueError, match="no scheduling phase 'grwo': the phases are health, candidates"):
        schedule(snap(**base, phases=("health", "grwo")))


def test_a_cluster_with_its_own_scheduler_is_handed_every_job_the_plan_allows_in_queue_order():
    """Slurm decides (phases HANDED_OFF): no free GPU is asked for, each tenant's queue goes in
    order, a tenant at its plan's max waits there, and its later jobs wait behind."""
    p = plan(PlanNode("a", max=4), PlanNode("b"))
    queued = [job(10, "a", workers=2, gpus=2, t=1), job(11, "a", workers=1, gpus=1, t=2),
              job(12, "b", workers=3, gpus=1, t=3), job(13, "b", workers=2, gpus=0, cpus=4, mem=512, t=4)]
    d = schedule(snap([], queued, [], plan_=p, phases=HANDED_OFF))
    assert [s.job_id for s in d.starts] == [10, 12, 13]
    assert {w.node for s in d.starts for w in s.placement} == {hand_off.ELSEWHERE}
    first = started(d)[10].placement
    assert [(w.rank, w.gpus) for w in first] == [(0, (0, 1)), (1, (0, 1))]
    assert [(w.cpus, w.memory_mb) for w in started(d)[13].placement] == [(4, 512), (4, 512)]
    assert [(w.job_id, w.reason.split(";")[0]) for w in d.waits] == [(11, "tenant a is at its max (4 GPUs in use)")]
    again = schedule(snap([], queued[1:2], [running(10, "a", [(0, 1), (2, 3)], node=hand_off.ELSEWHERE, gpw=2)],
                          plan_=plan(PlanNode("a", max=5)), phases=HANDED_OFF))
    assert [s.job_id for s in again.starts] == [11] and again.preempts == [] and again.resizes == []

"""The round's phases one at a time: each reads the state the earlier ones left."""

from deeppod.scheduler import PlanNode
from deeppod.scheduler.policy import _Round
from tests.scheduler.test_policy import job, node, plan, running, snap


def test_the_health_phase_alone_preempts_jobs_on_sick_nodes_and_nothing_else():
    sick = node("sick", healthy=False, used=(0,))
    r = _Round(snap([sick, node("ok", gpus=2)], [job(5)], [running(1, "a", [(0,)], node="sick")]))
    r.health()
    assert [p.job_id for p in r.st.out.preempts] == [1] and r.st.gone == {1}
    assert r.st.out.starts == [] and r.st.out.waits == []  # starting is a later phase


def test_an_eviction_gives_the_gpus_back_to_the_tenant_accounting_once():
    p = plan(PlanNode("a", guaranteed=2), PlanNode("b", guaranteed=0))
    r = _Round(snap([node(gpus=2, used=(0, 1))], [job(10, "a", workers=2)],
                    [running(1, "b", [(0,), (1,)], started=0)], plan_=p))
    r.health()
    r.candidates()
    assert r.st.tenants.usage["b"] == 2
    r.reclaim()
    assert [x.job_id for x in r.st.out.preempts] == [1] and r.st.leaving == {1}
    assert r.st.tenants.usage["b"] == 0 and r.st.victims["b"] == []
    assert 1 in r.st.borrowers and r.st.lost_own == set()  # b (guaranteed 0) lost a borrowed job, none of its own
    assert r.st.stopping_gpus == 2  # on their way back; the starts phase does not use them yet
    r.starts()
    assert r.st.out.starts == [] and "waiting for 2 GPUs" in r.st.out.waits[0].reason


def test_the_grow_phase_alone_grows_into_idle_gpus():
    r = _Round(snap([node(gpus=4, used=(0,))], [], [running(1, "a", [(0,)], max_workers=4, started=0)],
                    min_run_before_resize=0))
    r.candidates()
    r.grow()
    assert [(x.job_id, x.workers) for x in r.st.out.resizes] == [(1, 4)]

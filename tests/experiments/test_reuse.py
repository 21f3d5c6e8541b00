"""A search that reuses processes (--reuse, runtime.trials()), with the tune and job controllers
and the fake executor, on SQLite and PostgreSQL: the process a trial started in asks for the
next trial and runs it; a pruner stops the trial, not the job; a script that never asks gets
a process per trial; what is refused."""

import sys

import pytest
from sqlalchemy import func, select

from deeppod.contract import ENV_TRIAL, ENV_TRIAL_HOST, ENV_TRIAL_PARAMS
from deeppod.errors import InvalidRequest, NotFound
from deeppod.experiments import service
from deeppod.jobs import metrics
from deeppod.store.models import Job, JobMetric, Trial
from tests.experiments.test_controller import Harness, rising
from tests.fixtures import submit_job


class ReuseHarness(Harness):
    def create(self, who=None, **kw):
        """A reusing search's command names no {param}: its trials' values come from runtime.trials()."""
        if kw.get("reuse"):
            kw.setdefault("job", {"command": [sys.executable, "-c", "pass"], "workdir": str(self.tmp),
                                  "gpus_per_worker": 1})
        return super().create(who, **kw)


@pytest.fixture
def h(sessions, tmp_path):
    return ReuseHarness(sessions, tmp_path)


class Process:
    """What runtime.trials() does in one job's process, one call at a time. As it asks: the trial it
    ended (and that trial's turn) is said again at every ask until it is handed another, so a trial
    handed back to it meanwhile (a later turn) is not ended by that repeated word."""

    def __init__(self, h, job_id):
        self.h, self.job_id, self.done, self.turn, self.ran, self.pruned = h, job_id, None, 0, [], []
        self.kept: dict[int, int] = {}  # paused trials it keeps (number -> the next step): none here

    def ask(self):
        with self.h.sessions.begin() as s:
            answer = service.host_trial(s, self.h.world.alice, self.job_id, self.done, sorted(self.kept),
                                        self.turn if self.done is not None else None)
        for number in answer.get("forget", ()):  # pruned while paused: its state need not be kept
            del self.kept[number]
        if answer.get("number") is not None and (answer["number"], answer["turn"]) != (self.done, self.turn):
            self.done, self.turn = None, answer["turn"]
        return answer

    def report(self, number, step, value):
        with self.h.sessions.begin() as s:
            metrics.ingest(s, self.h.world.alice, self.job_id,
                           [{"step": step, "trial": number, "metrics": {"score": value}}])

    def run(self, answer, curve, steps):
        """One trial, step by step, a controller round between steps; stops when pruned."""
        number = answer["number"]
        self.ran.append(number)
        for k in range(steps(number) if callable(steps) else steps):
            self.report(number, k, curve(answer["params"], k))
            self.h.jobs.tick()
            self.h.tune.tick()
            with self.h.sessions() as s:
                state = service.trial_state(s, self.h.world.alice, self.job_id, number)
                # what the answer to its next metrics says, and what it asks when it has not reported
                assert (number in service.pruning(s, self.job_id)) == (state == "pruning")
                if state == "pruning":
                    self.pruned.append(number)
                    break
        self.done = number


def hosts(h, exp_id):
    with h.sessions() as s:
        return list(s.scalars(select(Job).where(Job.id.in_(select(Trial.job_id).where(Trial.experiment_id == exp_id)))
                              .order_by(Job.id)))


def drive(h, exp_id, curve, steps=3, rounds=300, process=Process):
    """Every started job's process (a ``process``) runs trial after trial until told it is finished."""
    procs: dict[int, Process] = {}
    finished: set[int] = set()
    for _ in range(rounds):
        h.jobs.tick()
        h.tune.tick()
        for job in hosts(h, exp_id):
            if job.state != "running" or job.id in finished:
                continue
            p = procs.setdefault(job.id, process(h, job.id))
            answer = p.ask()
            if answer.get("finished"):
                finished.add(job.id)
                h.fake.finish(job.id, {0: 0})
            elif answer.get("number") is not None:
                p.run(answer, curve, steps)
        if h.experiment(exp_id).state not in ("running", "stopping"):
            return procs
    raise AssertionError(f"experiment still {h.experiment(exp_id).state}")


def test_one_process_runs_trial_after_trial(h):
    exp_id = h.create(trials=5, parallel=1, reuse=True)
    procs = drive(h, exp_id, rising, steps=lambda n: 5 - n)  # each trial shorter than the last
    exp = h.experiment(exp_id)
    assert exp.state == "completed", exp.reason
    jobs = hosts(h, exp_id)
    assert len(jobs) == 1 and len(h.fake.launched) == 1  # five trials, one process
    env = h.fake.launched[jobs[0].id].workers[0].env
    assert env[ENV_TRIAL_HOST] == "1" and env[ENV_TRIAL] == "0" and "x" in env[ENV_TRIAL_PARAMS]
    assert procs[jobs[0].id].ran == [0, 1, 2, 3, 4]
    rows = h.trials(exp_id)
    assert [t.state for t, _ in rows] == ["completed"] * 5
    for t, _ in rows:  # each trial's value is its own last report, not the longer one's before it
        assert t.value == pytest.approx(t.params["x"] * (5 - t.number)) and t.claimed_at and t.done_at
        assert t.step == 4 - t.number
    top = max((t for t, _ in rows), key=lambda t: t.value)
    assert exp.best_trial == top.number
    with h.sessions() as s:  # every trial's series kept whole: 5 + 4 + 3 + 2 + 1 steps
        assert s.scalar(select(func.count()).select_from(JobMetric).where(JobMetric.job_id == jobs[0].id)) == 15
    assert h.fake.status[jobs[0].id].finished  # told it was finished, it exited


def test_parallel_processes_never_exceed_parallel(h):
    exp_id = h.create(trials=8, parallel=2, reuse=True)
    drive(h, exp_id, rising)
    assert h.experiment(exp_id).state == "completed"
    assert len(hosts(h, exp_id)) == 2
    assert sum(t.state == "completed" for t, _ in h.trials(exp_id)) == 8


def test_a_pruner_stops_the_trial_and_the_process_goes_on(h):
    exp_id = h.create(trials=8, parallel=1, reuse=True, pruner="median", seed=4)
    procs = drive(h, exp_id, rising, steps=5)
    rows = h.trials(exp_id)
    assert h.experiment(exp_id).state == "completed"
    pruned = [t for t, _ in rows if t.state == "pruned"]
    assert pruned, [(t.state, t.params) for t, _ in rows]
    assert sorted(n for p in procs.values() for n in p.pruned) == [t.number for t in pruned]
    assert all("pruned by median" in t.reason for t in pruned)
    jobs = hosts(h, exp_id)
    assert len(jobs) == 1 and jobs[0].stop_reason is None  # the job was never stopped for it
    assert jobs[0].state == "succeeded"
    with h.sessions() as s:
        assert service.pruning(s, jobs[0].id) == []  # ended: nothing left to tell the process


def test_a_script_that_never_asks_gets_a_process_per_trial(h):
    exp_id = h.create(trials=3, parallel=1, reuse=True)
    for _ in range(100):
        h.jobs.tick()
        h.tune.tick()
        with h.sessions.begin() as s:
            for job in s.scalars(select(Job).where(Job.kind == "trial", Job.state == "running")):
                if not h.fake.status[job.id].finished:
                    number = int(h.fake.launched[job.id].workers[0].env[ENV_TRIAL])  # what the runtime tags
                    metrics.ingest(s, h.world.alice, job.id, [{"step": 0, "trial": number, "metrics": {"score": 1}}])
                    h.fake.finish(job.id, {0: 0})
        if h.experiment(exp_id).state == "completed":
            break
    assert h.experiment(exp_id).state == "completed"
    assert len(hosts(h, exp_id)) == 3
    assert [t.state for t, _ in h.trials(exp_id)] == ["completed"] * 3


def test_what_is_refused(h):
    with pytest.raises(InvalidRequest, match="leave out --reuse"):
        h.create(reuse=True, register="best")
    with pytest.raises(InvalidRequest, match=r"read trial.params\['x'\]"):
        h.create(reuse=True, job={"command": [sys.executable, "-c", "pass", "{x}"], "workdir": str(h.tmp)})
    exp_id = h.create(trials=2, parallel=1, reuse=True)
    h.jobs.tick()
    job_id = hosts(h, exp_id)[0].id
    with h.sessions.begin() as s, pytest.raises(NotFound):  # another tenant's: as if missing
        service.host_trial(s, h.world.bob, job_id)
    with h.sessions.begin() as s, pytest.raises(InvalidRequest, match="did not run in job"):
        service.host_trial(s, h.world.alice, job_id, done=7)
    plain_id = submit_job(h.sessions, h.world.alice, str(h.tmp))  # a plain job has no trials to hand out
    with h.sessions.begin() as s, pytest.raises(InvalidRequest, match="not a search's trial"):
        service.host_trial(s, h.world.alice, plain_id)
    with h.sessions.begin() as s, pytest.raises(InvalidRequest, match="trial must be a whole number"):
        metrics.ingest(s, h.world.alice, job_id, [{"step": 0, "trial": -1, "metrics": {"score": 1}}])


def test_without_reuse_the_only_trial_is_handed_once_then_finished(h):
    exp_id = h.create(trials=2, parallel=1)
    h.jobs.tick()
    job_id = hosts(h, exp_id)[0].id
    with h.sessions.begin() as s:
        first = service.host_trial(s, h.world.alice, job_id)
    assert first["number"] == 0 and first["state"] == "running"
    with h.sessions.begin() as s:
        assert service.host_trial(s, h.world.alice, job_id, done=0) == {"finished": True}


def test_a_reused_process_shows_its_latest_trials_series_not_every_trials_mixed(h):
    exp_id = h.create(trials=3, parallel=1, reuse=True)
    drive(h, exp_id, rising, steps=lambda n: 4 - n)  # 4, 3 and 2 steps
    job_id = hosts(h, exp_id)[0].id
    with h.sessions() as s:
        shown = metrics.series(s, h.world.alice, job_id)
        last = s.scalar(select(Trial).where(Trial.job_id == job_id, Trial.number == 2))
    assert shown["trial"] == 2
    assert [st for st, _ in shown["metrics"]["score"]["series"]] == [0, 1]  # one series, in step order
    assert shown["metrics"]["score"]["last"][1] == pytest.approx(last.params["x"] * 2)
    plain = submit_job(h.sessions, h.world.alice, str(h.tmp))
    with h.sessions.begin() as s:
        metrics.ingest(s, h.world.alice, plain, [{"step": 0, "metrics": {"loss": 1.0}}])
    with h.sessions() as s:
        assert "trial" not in metrics.series(s, h.world.alice, plain)


def test_reports_at_a_rung_wait_for_the_pruners_decision(h):
    """An ASHA search's trials are told the steps its pruner decides on; the answer to reports
    that reach one waits for a controller round, begun after they were stored, to judge them."""
    import threading

    from deeppod.contract import ENV_TRIAL_JUDGED
    from tests.helpers import wait_until

    exp_id = h.create(trials=2, parallel=1, reuse=True, pruner="asha")
    h.jobs.tick()
    h.tune.tick()
    job = hosts(h, exp_id)[0]
    assert h.fake.launched[job.id].workers[0].env[ENV_TRIAL_JUDGED].startswith("1,3,9,27,")
    p = Process(h, job.id)
    number = p.ask()["number"]

    def waits(*steps, trial=number):
        with h.sessions() as s:
            return service.awaits_judgement(s, job.id, [{"step": k, "trial": trial} for k in steps])

    assert not waits(0) and waits(0, 1) and waits(2) and not waits(1, trial=number + 1)
    assert not waits() and not service.awaits_judgement(h.sessions(), job.id, [{"step": 3}])  # no trial: a job's own
    p.report(number, 0, 0.1)
    p.report(number, 1, 0.2)
    h.tune.tick()  # judged up to step 1: the next rung is 3
    assert not waits(2) and waits(2, 3)

    got = []
    waiter = threading.Thread(target=lambda: got.append(h.tune.judged(timeout=60)))
    waiter.start()
    wait_until(lambda: h.tune.hurry.is_set(), 30, what="the controller to be hurried")
    h.tune.tick()  # the round the answer waits for
    waiter.join(30)
    assert got == [True]
    assert h.tune.judged(timeout=0.01) is False  # no round came: the answer goes without it
    h.tune.leading = lambda: False  # a standby runs no round: it answers at once, without waiting
    h.tune.hurry.clear()
    assert h.tune.judged(timeout=120) is False and not h.tune.hurry.is_set()


def test_a_later_first_rung_is_what_trials_are_told_and_wait_for(h):
    from deeppod.contract import ENV_TRIAL_JUDGED

    exp_id = h.create(trials=2, parallel=1, reuse=True, pruner="asha", prune_after=3)
    h.jobs.tick()
    h.tune.tick()
    job = hosts(h, exp_id)[0]
    assert h.fake.launched[job.id].workers[0].env[ENV_TRIAL_JUDGED].startswith("3,9,27,")
    number = Process(h, job.id).ask()["number"]
    with h.sessions() as s:
        assert not service.awaits_judgement(s, job.id, [{"step": k, "trial": number} for k in (0, 1, 2)])
        assert service.awaits_judgement(s, job.id, [{"step": 3, "trial": number}])

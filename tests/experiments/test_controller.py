"""Experiments run by the tune controller with the job controller and the fake executor, on
SQLite and PostgreSQL: pruning, preemption of a trial, a restart of the server, registration,
refusals before any job exists."""

import sys

import pytest
from sqlalchemy import func, select

from deeppod.contract import HOLDING_STATES
from deeppod.errors import Conflict, InvalidRequest
from deeppod.executor.base import ExecStatus
from deeppod.executor.fake import FakeExecutor
from deeppod.experiments import service
from deeppod.experiments.controller import ExperimentController
from deeppod.job_spec import JobSpec
from deeppod.jobs import metrics
from deeppod.jobs.controller import JobController
from deeppod.jobs.service import submit
from deeppod.plans.service import apply_plan
from deeppod.states import ACTIVE_EXPERIMENTS
from deeppod.store.models import Experiment, Job, ModelVersion, Trial
from tests.fixtures import populate
from tests.models.test_service import artifact


class Harness:
    def __init__(self, sessions, tmp_path, world=None):
        self.sessions, self.tmp = sessions, tmp_path
        self.world = world or populate(sessions)
        self.fake = FakeExecutor()
        self.restart()
        self.progress: dict[int, int] = {}
        self.metric = "score"  # what the trials report

    def restart(self):
        """A new server process: new controllers and study caches, the same database and files
        (the fake executor's jobs keep running, as real ones do)."""
        self.jobs = JobController(self.sessions, self.fake, jobs_dir=self.tmp / "jobs", api_url="http://127.0.0.1:1",
                                  server_env={"PATH": "/usr/bin"})
        self.launcher = service.TrialLauncher(experiments_dir=self.tmp / "experiments", jobs_dir=self.tmp / "jobs",
                                         models_dir=self.tmp / "models")
        self.tune = ExperimentController(self.sessions, self.launcher)

    def create(self, who=None, **kw):
        req = dict(name="search", metric="score", mode="max", trials=6, parallel=2, sampler="random", pruner="none",
                   seed=1, space={"x": {"type": "float", "low": 0.0, "high": 1.0}},
                   job={"command": [sys.executable, "-c", "pass", "{x}"], "workdir": str(self.tmp),
                        "gpus_per_worker": 1})
        req.update(kw)
        with self.sessions.begin() as s:
            return service.create(s, who or self.world.alice, service.ExperimentRequest(**req), self.launcher).id

    def round(self, curve, steps):
        """One round of both loops; every running trial reports one more step, and ends after
        ``steps`` (writing a model artifact, as the built-in trainer does)."""
        self.jobs.tick()
        self.tune.tick()
        with self.sessions.begin() as s:
            running = list(s.scalars(select(Job).where(Job.kind == "trial", Job.state == "running")))
            for job in running:
                if job.id not in self.fake.launched or self.fake.status[job.id].finished:
                    continue
                k = self.progress.get(job.id, 0)
                metrics.ingest(s, self.world.alice if job.user_id == self.world.alice.user_id else self.world.bob,
                               job.id, [{"step": k, "metrics": {self.metric: curve(job.params, k)}}])
                self.progress[job.id] = k + 1
                if k + 1 >= steps:
                    artifact(self.tmp / "jobs" / str(job.id) / "model")
                    self.fake.finish(job.id, {0: 0})

    def run(self, exp_id, curve, steps=6, rounds=200):
        for _ in range(rounds):
            self.round(curve, steps)
            if self.experiment(exp_id).state not in ACTIVE_EXPERIMENTS:
                return self.experiment(exp_id)
        raise AssertionError(f"experiment still {self.experiment(exp_id).state} after {rounds} rounds")

    def experiment(self, exp_id):
        with self.sessions() as s:
            return s.get(Experiment, exp_id)

    def trials(self, exp_id):
        with self.sessions() as s:
            return [(t, s.get(Job, t.job_id)) for t in s.scalars(select(Trial).where(Trial.experiment_id == exp_id)
                                                                  .order_by(Trial.number))]


def rising(params, step):
    return params["x"] * (step + 1)


@pytest.fixture
def h(sessions, tmp_path):
    return Harness(sessions, tmp_path)


def test_a_search_that_prunes(h):
    exp_id = h.create(trials=10, parallel=2, sampler="random", pruner="median")
    exp = h.run(exp_id, rising)
    assert exp.state == "completed", exp.reason
    rows = h.trials(exp_id)
    assert len(rows) == 10
    pruned = [(t, j) for t, j in rows if t.state == "pruned"]
    assert pruned, [(t.state, t.params) for t, _ in rows]
    for t, j in pruned:
        assert j.state == "pruned" and j.state not in HOLDING_STATES and j.allocation is not None
        assert t.step < 5 and "pruned by median" in j.reason
    completed = [t for t, _ in rows if t.state == "completed"]
    top = max(completed, key=lambda t: t.value)
    assert exp.best_trial == top.number and top.value == pytest.approx(top.params["x"] * 6)
    # the best complete trial has the highest x of all that completed, and no pruned one beat it
    assert all(t.params["x"] <= top.params["x"] for t, _ in rows)
    with h.sessions() as s:  # every trial's GPU went back: nothing holds one
        assert s.scalar(select(func.count()).select_from(Job).where(Job.state.in_(HOLDING_STATES))) == 0


def test_asha_prunes_the_weak_half(h):
    exp_id = h.create(trials=12, parallel=3, sampler="random", pruner="asha", seed=3)
    exp = h.run(exp_id, rising, steps=9)
    rows = h.trials(exp_id)
    assert exp.state == "completed" and len(rows) == 12
    assert sum(t.state == "pruned" for t, _ in rows) >= 3, [(t.state, t.step) for t, _ in rows]


def test_parallel_is_an_upper_bound_and_params_reach_the_job(h):
    exp_id = h.create(trials=6, parallel=3)
    for _ in range(8):
        h.jobs.tick()
        h.tune.tick()
    rows = h.trials(exp_id)
    assert len([j for _, j in rows if j.state == "running"]) == 3
    t, j = rows[0]
    spec = h.fake.launched[j.id]
    assert spec.command[-1] == repr(t.params["x"]) and j.kind == "trial"
    assert spec.workers[0].env["DEEPPOD_PARAM_X"] == str(t.params["x"])
    assert spec.workers[0].env["DEEPPOD_METRICS_FLUSH_SECONDS"] == "0.2"  # the pruner sees reports sooner


def test_a_trial_being_pruned_does_not_hold_back_the_next(h):
    """Its GPU is on its way back: the next trial is asked for at once and starts when it is."""
    exp_id = h.create(trials=3, parallel=1, pruner="median")
    for _ in range(3):
        h.jobs.tick()
        h.tune.tick()
    [(t, j)] = h.trials(exp_id)
    assert j.state == "running"
    with h.sessions.begin() as s:
        h.tune._prune(s, s.get(Experiment, exp_id), s.get(Trial, t.id), s.get(Job, j.id), (0, 0.1))
    h.tune.tick()
    h.tune.tick()
    rows = h.trials(exp_id)
    assert [(r.state, job.state) for r, job in rows] == [("pruning", "running"), ("running", "queued")]
    with h.sessions() as s:  # the answer to its job's metrics says so: its process stops at once
        assert service.pruning(s, j.id) == [t.number] and service.pruning(s, rows[1][1].id) == []
    h.jobs.tick()  # the pruned trial is told to stop; it exits
    h.fake.finish(j.id, {0: 75})
    for _ in range(3):
        h.jobs.tick()
        h.tune.tick()
    rows = h.trials(exp_id)
    assert [r.state for r, _ in rows][:2] == ["pruned", "running"] and rows[1][1].state == "running"
    with h.sessions() as s:
        assert service.pruning(s, j.id) == []  # ended: nothing left to tell


def test_the_search_fills_only_the_gpus_there_are(h):
    """4 GPUs, trials of 3 GPUs, parallel 4: one runs, one waits, no more are asked for."""
    exp_id = h.create(trials=8, parallel=4, job={"command": [sys.executable, "-c", "pass", "{x}"],
                                                 "workdir": str(h.tmp), "gpus_per_worker": 3})
    for _ in range(6):
        h.jobs.tick()
        h.tune.tick()
    states = sorted(j.state for _, j in h.trials(exp_id))
    assert states == ["queued", "running"]


def test_a_preempted_trial_resumes_and_counts_once(h):
    with h.sessions.begin() as s:
        apply_plan(s, h.world.admin, {"tenants": [{"name": "a", "guaranteed": 0}, {"name": "b", "guaranteed": 4}]})
    exp_id = h.create(trials=4, parallel=4)
    for _ in range(5):
        h.round(rising, steps=8)
    assert sum(j.state == "running" for _, j in h.trials(exp_id)) == 4
    with h.sessions.begin() as s:  # tenant b wants its guaranteed GPUs back
        bob_job = submit(s, h.world.bob, JobSpec(command=[sys.executable, "-c", "pass"], workdir=str(h.tmp),
                                                    workers=2, gpus_per_worker=1), default_grace=30).id
    for _ in range(3):
        h.round(rising, steps=8)
    rows = h.trials(exp_id)
    assert sum(j.restart_count for _, j in rows) >= 2  # two trials gave their GPUs back
    h.fake.finish(bob_job, {0: 0, 1: 0})
    exp = h.run(exp_id, rising, steps=8)
    rows = h.trials(exp_id)
    assert exp.state == "completed" and len(rows) == 4 and len({j.id for _, j in rows}) == 4
    resumed = [(t, j) for t, j in rows if j.restart_count]
    assert resumed and all(t.state == "completed" and t.step == 7 for t, _ in resumed)
    assert len(h.launcher.study(exp).study.trials) == 4  # a resumed trial is the same trial


def test_trials_are_the_first_to_give_gpus_back(h):
    with h.sessions.begin() as s:
        apply_plan(s, h.world.admin, {"tenants": [{"name": "a", "guaranteed": 0}, {"name": "b", "guaranteed": 4}]})
        plain = submit(s, h.world.alice, JobSpec(command=[sys.executable, "-c", "pass"], workdir=str(h.tmp),
                                                    gpus_per_worker=2), default_grace=30).id
    h.jobs.tick()
    exp_id = h.create(trials=2, parallel=2)
    for _ in range(4):
        h.round(rising, steps=50)
    with h.sessions.begin() as s:
        submit(s, h.world.bob, JobSpec(command=[sys.executable, "-c", "pass"], workdir=str(h.tmp),
                                          workers=2, gpus_per_worker=1), default_grace=30)
    h.jobs.tick()
    with h.sessions() as s:
        assert s.get(Job, plain).state == "running"  # started last... and still not the victim
    assert sorted(j.state for _, j in h.trials(exp_id)) == ["preempted", "preempted"]


def test_an_experiment_survives_a_server_restart(h):
    exp_id = h.create(trials=6, parallel=2)
    for _ in range(5):
        h.round(rising, steps=6)
    before = h.trials(exp_id)
    assert 2 <= len(before) < 6
    h.restart()
    exp = h.run(exp_id, rising)
    rows = h.trials(exp_id)
    assert exp.state == "completed" and len(rows) == 6
    assert [t.number for t, _ in rows] == list(range(6))
    assert len({t.params["x"] for t, _ in rows}) == 6  # the seeded sampler, opened again, asks anew
    assert h.launcher.study(exp).study.trials[-1].state.is_finished()
    assert len(h.launcher.study(exp).study.trials) == 6  # none asked twice


def test_a_seeds_start_up_trials_are_the_ones_optunas_own_study_with_that_seed_proposes(h):
    """The study that asked the first trial at create goes on in the controller (one random
    stream): not a stream of seed + 1 from the second trial on."""
    import optuna

    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "lr": {"type": "float", "low": 1e-4, "high": 1.0,
                                                                     "log": True}}
    exp_id = h.create(trials=6, parallel=2, sampler="tpe", seed=7, space=space,
                      job={"command": [sys.executable, "-c", "pass", "{x}", "{lr}"], "workdir": str(h.tmp),
                           "gpus_per_worker": 1})
    h.run(exp_id, rising)
    own = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=7))
    expected = [own.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0),
                         "lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)}).params for _ in range(6)]
    assert [t.params for t, _ in h.trials(exp_id)] == expected


def test_a_search_whose_create_is_rolled_back_hands_no_study_over(h):
    req = dict(name="gone", metric="score", mode="max", trials=2, parallel=1, sampler="tpe", pruner="none", seed=1,
               space={"x": {"type": "float", "low": 0.0, "high": 1.0}},
               job={"command": [sys.executable, "-c", "pass", "{x}"], "workdir": str(h.tmp), "gpus_per_worker": 1})
    with h.sessions() as s:
        service.create(s, h.world.alice, service.ExperimentRequest(**req), h.launcher)
        s.rollback()
    assert not h.launcher._handed


def test_stop_and_resume(h):
    exp_id = h.create(trials=4, parallel=2)
    for _ in range(3):
        h.round(rising, steps=6)
    with h.sessions.begin() as s:
        service.stop(s, h.world.alice, "search")
    for _ in range(3):
        h.round(rising, steps=6)
    exp = h.experiment(exp_id)
    assert exp.state == "stopped"
    assert {t.state for t, _ in h.trials(exp_id)} == {"stopped"}
    with h.sessions.begin() as s:
        service.resume(s, h.world.alice, "search")
    exp = h.run(exp_id, rising)
    rows = h.trials(exp_id)
    assert exp.state == "completed" and len(rows) == 4
    assert all(t.state == "completed" for t, _ in rows)


def test_register_puts_the_experiment_in_the_best_models_lineage(h):
    exp_id = h.create(trials=3, parallel=3, register="searched")
    exp = h.run(exp_id, rising)
    assert exp.state == "completed" and exp.registered == "searched@1", exp.reason
    with h.sessions() as s:
        v = s.scalar(select(ModelVersion))
        top = s.scalar(select(Trial).where(Trial.experiment_id == exp_id, Trial.number == exp.best_trial))
    assert v.lineage["experiment"] == "search" and v.lineage["trial"] == exp.best_trial
    assert v.lineage["hyperparameters"] == top.params and v.lineage["job_id"] == top.job_id


def at_chance(params, step):
    return 0.5  # the artifact's signature has two classes: a coin toss


@pytest.mark.parametrize("forced", [False, True])
def test_a_best_model_no_better_than_chance_is_registered_only_when_forced(h, forced):
    h.metric = "val_accuracy"
    exp_id = h.create(trials=2, parallel=2, register="guess", metric="val_accuracy", register_at_chance=forced)
    exp = h.run(exp_id, at_chance)
    assert exp.state == "completed"
    with h.sessions() as s:
        versions = s.scalar(select(func.count()).select_from(ModelVersion))
    if forced:
        assert exp.registered == "guess@1" and versions == 1, exp.reason
    else:
        assert exp.registered is None and versions == 0
        assert "not registered as guess: val_accuracy 0.5 is no better than chance (0.5, 1 of 2 classes)" in exp.reason
        assert "--register-at-chance" in exp.reason


@pytest.mark.parametrize("change, words", [
    ({"space": {"x": {"type": "uniform", "low": 0, "high": 1}}}, "unknown type 'uniform'"),
    ({"space": {"x": {"type": "float", "low": 1, "high": 1}}}, "is empty"),
    ({"space": {"x": {"type": "float", "low": 0, "high": 1}, "y": {"type": "int", "low": 1, "high": 3}}},
     "parameter y is never used"),
    ({"sampler": "bayes"}, "unknown sampler 'bayes'"),
    ({"pruner": "asha2"}, "unknown pruner"),
    ({"prune_after": 0}, "--prune-after must be a step from 1"),
    ({"sampler": "grid"}, "grid sampler needs a finite set"),
    ({"mode": "up"}, "--mode must be min or max"),
    ({"job": {"command": ["no-such-program-xyz", "{x}"], "workdir": "/tmp"}}, "was not found"),
    ({"job": {"command": [sys.executable, "{x}"], "workdir": "/tmp", "gpus_per_worker": 9}}, "whole cluster has 4"),
])
def test_bad_searches_are_refused_before_any_job(h, change, words):
    with pytest.raises(InvalidRequest) as e:
        h.create(**change)
    assert words in str(e.value)
    with h.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 0
        assert s.scalar(select(func.count()).select_from(Experiment)) == 0
    assert not any((h.tmp / "experiments").glob("*/*"))


def test_names_are_per_tenant_and_others_see_nothing(h):
    h.create()
    with pytest.raises(Conflict):
        h.create()
    h.create(who=h.world.bob)  # the same name in another tenant
    with h.sessions() as s:
        assert [e.name for e, *_ in service.list_experiments(s, h.world.bob)] == ["search"]
        assert len(service.list_experiments(s, h.world.admin)) == 2
        with pytest.raises(Exception, match="only an admin"):
            service.get_experiment(s, h.world.bob, "search", tenant="a")


def test_a_search_asks_for_its_next_trial_as_soon_as_the_last_starts(api, tmp_path):
    """The server's loops hurry each other (server._on_commits): a trial added starts at the
    job loop's next round, which comes at once; a trial's job that starts or ends brings the
    search's next round at once. A round that moves no trial's job hurries nothing."""
    ctx = api.ctx
    ctx.jobs.hurry.clear()
    r = api.http.post("/v1/experiments", headers=api.as_(api.admin), json={
        "name": "pace", "metric": "score", "mode": "max", "trials": 4, "parallel": 4, "sampler": "random",
        "pruner": "none", "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "job": {"command": [sys.executable, "-c", "pass", "{x}"], "workdir": str(tmp_path), "gpus_per_worker": 1}})
    assert r.status_code == 201, r.text
    assert ctx.jobs.hurry.is_set()  # trial 0 asked for
    ctx.experiments.hurry.clear()
    ctx.jobs.tick()  # and started
    assert ctx.experiments.hurry.is_set()
    ctx.experiments.hurry.clear()
    ctx.jobs.tick()  # nothing moved
    assert not ctx.experiments.hurry.is_set()
    ctx.jobs.hurry.clear()
    ctx.experiments.tick()  # trial 1 asked for now: trial 0 runs
    assert ctx.jobs.hurry.is_set()
    with ctx.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Trial)) == 2


def test_a_round_reads_only_the_live_trials_not_every_one_the_search_asked(h):
    """A search thousands of trials long must not load every trial and its job each round
    (the soak's memory grew with the trials asked)."""
    from sqlalchemy import event

    exp_id = h.create(trials=12, parallel=2)
    for _ in range(200):
        h.round(rising, 2)
        if sum(t.state == "completed" for t, _ in h.trials(exp_id)) >= 6:
            break
    rows = h.trials(exp_id)
    live = {t.id for t, _ in rows if t.state in ("running", "pruning")}
    assert len(rows) - len(live) >= 6
    loaded = []

    def seen(session, instance):
        if isinstance(instance, (Trial, Job)) and getattr(instance, "kind", "trial") == "trial":
            loaded.append(instance)

    event.listen(h.sessions, "loaded_as_persistent", seen)
    try:
        h.tune.tick()
    finally:
        event.remove(h.sessions, "loaded_as_persistent", seen)
    trials_read = {t.id for t in loaded if isinstance(t, Trial)}
    assert trials_read and trials_read <= live, (trials_read, live)
    assert h.run(exp_id, rising, steps=2).state == "completed"
    assert sum(t.state == "completed" for t, _ in h.trials(exp_id)) == 12


def test_a_trial_judged_again_between_rungs_says_which_rung_it_fell_behind_at(h):
    exp_id = h.create(trials=2, parallel=2, sampler="random", pruner="asha")  # rungs at steps 1, 3, 9, ...
    for _ in range(3):
        h.jobs.tick()
        h.tune.tick()
    (t0, j0), (t1, j1) = h.trials(exp_id)
    with h.sessions.begin() as s:
        exp = s.get(Experiment, exp_id)
        h.tune._prune(s, exp, s.get(Trial, t0.id), s.get(Job, j0.id), (5, 0.1))
        h.tune._prune(s, exp, s.get(Trial, t1.id), s.get(Job, j1.id), (3, 0.2))
    with h.sessions() as s:
        between, at_rung = s.get(Trial, t0.id).reason, s.get(Trial, t1.id).reason
    assert between == ("pruned by asha at step 5 (score 0.1): no longer among the best third at step 3, "
                       "which it reached among the first")
    assert at_rung == "pruned by asha at step 3 (score 0.2)"


def test_a_trial_that_reaches_its_time_limit_counts_the_last_value_it_reported(h):
    """A trial's time limit is its budget (Ray Tune's time_total_s): it is stopped, not failed."""
    exp_id = h.create(trials=1, parallel=1, job={"command": [sys.executable, "-c", "pass", "{x}"],
                                                 "workdir": str(h.tmp), "time_limit_seconds": 1800})
    for _ in range(4):
        h.round(rising, steps=100)
    (t, j), = h.trials(exp_id)
    assert j.state == "running" and j.time_limit_seconds == 1800 and h.progress[j.id] >= 2
    h.fake.status[j.id] = ExecStatus(finished=True, exit_codes={0: 75}, timed_out=True)  # its cluster's word
    exp = h.run(exp_id, rising, steps=100, rounds=5)
    (t, j), = h.trials(exp_id)
    assert j.state == "stopped" and j.reason.startswith("stopped at its time limit of 30m"), j.reason
    assert t.state == "completed" and t.value == pytest.approx(rising(t.params, h.progress[j.id] - 1)), t.reason
    assert t.reason == "it reached its time limit of 30m: its last score counts"
    assert exp.state == "completed" and exp.best_trial == 0, exp.reason

"""runtime.trials() outside a reusing search: one trial, from the job's environment (or none
outside DeepPod); the reporter tags what it sends with the trial it is for. (The reusing
path, trial after trial from a live server, is in tests/e2e/test_tune_reuse.py.)"""

import contextlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from deeppod import runtime
from deeppod.contract import (
    ENV_TRIAL,
    ENV_TRIAL_HOST,
    ENV_TRIAL_JUDGED,
    ENV_TRIAL_PARAMS,
    JUDGEMENT_WAIT_S,
    free_port,
)
from deeppod.runtime import metrics, stop
from deeppod.runtime.metrics import Reporter
from deeppod.runtime.trial import Trial
from tests.helpers import wait_until
from tests.runtime.test_metrics import Sink


def test_outside_deeppod_the_loop_runs_once_with_no_parameters(monkeypatch):
    for var in (ENV_TRIAL, ENV_TRIAL_PARAMS, ENV_TRIAL_HOST):
        monkeypatch.delenv(var, raising=False)
    got = list(runtime.trials())
    assert len(got) == 1 and got[0].number is None and got[0].params == {}
    assert got[0].should_stop() is False


def test_a_trial_job_that_does_not_reuse_runs_its_own_trial_with_typed_values(monkeypatch):
    monkeypatch.setenv(ENV_TRIAL, "3")
    monkeypatch.setenv(ENV_TRIAL_PARAMS, '{"lr": 0.01, "batch_size": 64, "opt": "sgd"}')
    monkeypatch.delenv(ENV_TRIAL_HOST, raising=False)
    (trial,) = list(runtime.trials())
    assert trial.number == 3 and trial.params == {"lr": 0.01, "batch_size": 64, "opt": "sgd"}


def test_a_host_flag_without_a_server_still_runs_the_one_trial(monkeypatch):
    """DEEPPOD_TRIAL_HOST copied into a shell outside DeepPod: no API, no token, one trial."""
    monkeypatch.setenv(ENV_TRIAL_HOST, "1")
    monkeypatch.setenv(ENV_TRIAL_PARAMS, '{"x": 1}')
    monkeypatch.delenv("DEEPPOD_API_URL", raising=False)
    assert [t.params for t in runtime.trials()] == [{"x": 1}]


def test_the_reporter_tags_each_point_with_its_trial(monkeypatch):
    monkeypatch.setenv(ENV_TRIAL, "2")
    port = free_port()
    sink = Sink(port)
    try:
        rep = Reporter(api_url=f"http://127.0.0.1:{port}", token="tok", job_id=7, flush_seconds=0.05, enabled=True)
        rep.report(0, loss=1.0)
        rep.trial = 5  # what runtime.trials() sets when the process takes trial 5
        rep.report(0, loss=0.5)
        assert rep.flush()
        wait_until(lambda: len(sink.points) == 2, 10, what="both points")
        assert [(p["trial"], p["metrics"]["loss"]) for p in sink.points] == [(2, 1.0), (5, 0.5)]
        rep.close()
    finally:
        sink.close()


@contextlib.contextmanager
def answering(pruned: Callable[[list[dict]], list[int]], flush_seconds: float = 30):
    """A metrics endpoint whose answer names the trials ``pruned(points)`` returns (it may take
    its time, as a pruner's round does), and a Reporter that sends to it: with the default
    flush, only a report the pruner judges is sent before close()."""

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            points = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["points"]
            body = json.dumps({"stored": len(points), "pruning": pruned(points)}).encode()
            self.send_response(202)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rep = Reporter(api_url=f"http://127.0.0.1:{server.server_address[1]}", token="tok", job_id=7,
                   flush_seconds=flush_seconds, enabled=True)
    try:
        yield rep
    finally:
        rep.close(timeout=2)
        server.shutdown()
        server.server_close()


def waits(rep: Reporter) -> list[float]:
    """The waits the reporter makes for the server's answer (their bounds), recorded as made:
    whether a call waited is read from here, not from a clock."""
    made: list[float] = []
    real = rep._answers.wait_for

    def wait_for(predicate, timeout=None):
        made.append(timeout)
        return real(predicate, timeout)

    rep._answers.wait_for = wait_for
    return made


def pruned_at(step: int, trial: int, sent: list | None = None):
    """An answer that, for a batch reaching ``step``, takes 0.3 s (the pruner's round) and names ``trial``."""

    def answer(points: list[dict]) -> list[int]:
        if sent is not None:
            sent.extend(points)
        if any(p["step"] == step for p in points):
            time.sleep(0.3)
            return [trial]
        return []

    return answer


def test_the_reporter_hears_which_trials_a_pruner_stopped_from_the_answer_to_its_metrics():
    with answering(lambda points: [4], flush_seconds=0.05) as rep:
        assert rep.pruning == frozenset()
        rep.report(0, loss=1.0)
        assert rep.flush()
        assert rep.pruning == frozenset({4})


def test_at_a_rung_should_stop_waits_for_the_pruners_answer_so_no_epoch_runs_past_it(monkeypatch):
    """A report at a step the pruner decides on is answered once the decision is made (here
    0.3 s later): the trial's next should_stop() waits for that answer, so a pruned trial
    stops at the rung, not an epoch after. A report between rungs waits for nothing."""
    sent: list[dict] = []
    monkeypatch.setenv(ENV_TRIAL, "4")
    monkeypatch.setenv(ENV_TRIAL_JUDGED, "3,9,27")
    monkeypatch.setenv(ENV_TRIAL_HOST, "1")  # a process that runs trial after trial: the trial stops, not the job
    with answering(pruned_at(3, 4, sent)) as rep:
        monkeypatch.setattr(metrics, "_default", rep)
        trial = Trial(4, {}, object())  # a host that it has asked lately: only the answers to its reports count
        waited = waits(rep)
        rep.report(2, acc=0.1)
        assert trial.should_stop() is False
        assert waited == [], "a report between rungs waits for nothing"
        rep.report(3, acc=0.1)
        assert trial.should_stop() is True
        assert waited == [JUDGEMENT_WAIT_S], "the report at the rung is waited for, once"
        assert [p["step"] for p in sent] == [2, 3] and all("_judged" not in p for p in sent)
        assert not stop.should_stop(sync=False), "the process goes on to its next trial"


def test_a_job_that_runs_one_trial_stops_at_the_rung_its_pruner_stopped_it_at(monkeypatch):
    """Without --reuse a trial is its job: the answer to its report at a rung says it was
    pruned, so runtime.should_stop() is true in that same step (the server's SIGTERM, asked
    for before it answered, comes too), not an epoch later."""
    monkeypatch.setenv(ENV_TRIAL, "6")
    monkeypatch.setenv(ENV_TRIAL_JUDGED, "3,9,27")
    monkeypatch.delenv(ENV_TRIAL_HOST, raising=False)
    stop._reset_for_tests()
    try:
        with answering(pruned_at(9, 6)) as rep:
            monkeypatch.setattr(metrics, "_default", rep)
            rep.report(3, acc=0.5)  # a rung it passes
            assert runtime.should_stop() is False
            rep.report(9, acc=0.1)
            assert runtime.should_stop() is True
            assert "pruner stopped trial 6" in stop.stop_reason()
    finally:
        stop._reset_for_tests()


def test_a_server_that_does_not_answer_a_rung_costs_the_trial_one_wait_not_one_a_step(monkeypatch):
    """A control plane failing over does not answer the report at a rung: should_stop() waits
    for it once (its bound), then the steps after it go on without waiting."""
    release = threading.Event()

    def held(points):
        release.wait(10)  # no answer while the test runs
        return []

    monkeypatch.setenv(ENV_TRIAL, "2")
    monkeypatch.setenv(ENV_TRIAL_JUDGED, "3,9,27")
    with answering(held) as rep:
        try:
            waited = waits(rep)
            rep.report(3, acc=0.5)
            began = time.monotonic()
            assert rep.await_judgement(0.3) is False
            assert time.monotonic() - began >= 0.3
            for _ in range(20):  # the steps after it
                assert rep.await_judgement(0.3) is False
            assert waited == [0.3], "one wait for the report at the rung, none for the steps after it"
        finally:
            release.set()


def test_a_pruner_that_decides_at_every_step_is_not_waited_for(monkeypatch):
    """The median rule judges every step: its reports are sent at once, but a trial does not
    wait a round trip each step for the answer (it hears it from a later one)."""
    got = threading.Event()

    def slow(points):
        got.set()
        time.sleep(0.5)  # the pruner's round
        return []

    monkeypatch.setenv(ENV_TRIAL, "2")
    monkeypatch.setenv(ENV_TRIAL_JUDGED, "*")
    with answering(slow) as rep:
        waited = waits(rep)
        rep.report(0, acc=0.5)
        assert rep.await_judgement(2.0) is True
        assert waited == [], "no wait for the answer"
        assert got.wait(5), "sent at once, not at the next flush (30 s)"


class _Told:
    """What runtime.trials() reads of the metrics reporter: the answers' pruning and pausing."""

    def __init__(self):
        self.trial, self.pruning, self.pausing = None, frozenset(), frozenset()

    def flush(self):
        return True

    def await_judgement(self, timeout):
        return True


def test_a_paused_trial_is_kept_and_handed_back_with_what_the_script_kept(monkeypatch):
    """asha-promote: the loop keeps what a paused trial's script gave keep(), says so when it
    asks for the next, and hands it back as trial.kept on the trial's next turn; what it was
    told of the pause before does not stop the promoted trial at once; a trial that was not
    paused is not kept."""
    from deeppod.runtime import trial as trial_mod

    answers = [{"number": 0, "params": {"x": 1}, "state": "running", "turn": 0},
               {"number": 1, "params": {"x": 2}, "state": "running", "turn": 0},
               {"number": 0, "params": {"x": 1}, "state": "running", "turn": 1}]
    asked = []

    class Host:
        def __init__(self, *a):
            pass

        def next(self, done, turn=0, kept=None):
            asked.append((done, turn, sorted(kept or ())))
            return answers.pop(0) if answers else None

        def state(self, number):
            return "running"

    told = _Told()
    monkeypatch.setattr(trial_mod, "_Host", Host)
    monkeypatch.setattr(metrics, "_default", told)
    monkeypatch.setenv(ENV_TRIAL_HOST, "1")
    monkeypatch.setenv("DEEPPOD_JOB_ID", "7")
    monkeypatch.setenv("DEEPPOD_API_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("DEEPPOD_TOKEN", "tok")
    seen = []
    for t in runtime.trials():
        seen.append((t.number, t.kept))
        if t.number == 0 and t.kept is None:
            told.pausing = frozenset({0})  # the answer to its report at the rung
            assert t.should_stop() and t.paused
        else:
            assert not t.should_stop() and not t.paused
        t.keep(f"state of {t.number}")
    assert seen == [(0, None), (1, None), (0, "state of 0")]
    assert asked == [(None, 0, []), (0, 0, [0]), (1, 0, [0]), (0, 1, [])]


def test_the_host_drops_what_the_server_says_will_not_go_on(monkeypatch):
    from deeppod.runtime import trial as trial_mod

    host = trial_mod._Host("http://127.0.0.1:1", 7, "tok", 0)
    bodies = []
    monkeypatch.setattr(host, "_call", lambda path, body=None: bodies.append(body) or {"finished": True, "forget": [3]})
    kept = {3: "a", 5: "b"}
    assert host.next(4, 0, kept) is None
    assert kept == {5: "b"} and bodies == [{"done": 4, "kept": [3, 5], "turn": 0}]  # which turn of 4 ended

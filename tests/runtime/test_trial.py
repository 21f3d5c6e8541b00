"""runtime.trials() outside a reusing search: one trial, from the job's environment (or none
outside DeepPod); the reporter tags what it sends with the trial it is for. (The reusing
path, trial after trial from a live server, is in tests/e2e/test_tune_reuse.py.)"""

from deeppod import runtime
from deeppod.contract import ENV_TRIAL, ENV_TRIAL_HOST, ENV_TRIAL_PARAMS, free_port
from deeppod.runtime.metrics import Reporter
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


def test_the_reporter_hears_which_trials_a_pruner_stopped_from_the_answer_to_its_metrics():
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(202)
            self.end_headers()
            self.wfile.write(json.dumps({"stored": 1, "pruning": [4]}).encode())

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rep = Reporter(api_url=f"http://127.0.0.1:{server.server_address[1]}", token="tok", job_id=7,
                       flush_seconds=0.05, enabled=True)
        assert rep.pruning == frozenset()
        rep.report(0, loss=1.0)
        assert rep.flush()
        assert rep.pruning == frozenset({4})
        rep.close()
    finally:
        server.shutdown()
        server.server_close()

"""The reporter never blocks the step, batches, and survives the server being down."""

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from deeppod.contract import free_port
from deeppod.runtime.metrics import Reporter, histogram
from deeppod.runtime.tensorboard import read_records
from tests.helpers import wait_until


class Sink:
    def __init__(self, port):
        self.points, self.requests = [], 0
        sink = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert self.headers["Authorization"] == "Bearer tok"
                sink.points += body["points"]
                sink.requests += 1
                self.send_response(202)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_report_is_cheap_batched_and_survives_an_outage(tmp_path):
    port = free_port()
    rep = Reporter(api_url=f"http://127.0.0.1:{port}", token="tok", job_id=7, tb_dir=str(tmp_path / "tb"),
                   flush_seconds=0.2, enabled=True)
    for step in range(2000):  # the server is down (what a call costs: benchmarks/report_cost.py)
        rep.report(step, loss=torch.tensor(1.0 / (step + 1)), accuracy=0.5)
    wait_until(lambda: rep.failed_sends >= 2, 30, interval=0.05, what="two failed sends, with backoff")
    sink = Sink(port)  # the server comes back
    try:
        rep.report(2000, loss=float("nan"))
        assert rep.flush(timeout=20)
        steps = sorted(p["step"] for p in sink.points)
        assert steps == list(range(2001))  # nothing lost across the outage
        assert sink.requests < 20  # batched
        nan = [p for p in sink.points if p["step"] == 2000][0]["metrics"]["loss"]
        assert nan == "nan"
    finally:
        rep.close()
        sink.close()
    records = read_records(next((tmp_path / "tb").glob("events.out.tfevents.*")))
    assert len(records) == 1 + 2001


def test_histogram_is_compact_and_ignores_non_finite():
    h = histogram(torch.tensor([0.0, 1.0, 2.0, 3.0, float("nan"), float("inf")]), bins=3)
    assert h["min"] == 0.0 and h["max"] == 3.0 and sum(h["counts"]) == 4 and len(h["counts"]) == 3
    assert math.isfinite(sum(h["counts"]))


def test_disabled_on_other_ranks(tmp_path):
    sink = Sink(free_port())
    rep = Reporter(api_url=f"http://127.0.0.1:{sink.server.server_port}", token="t", job_id=1, enabled=False,
                   flush_seconds=0.05)
    try:
        rep.report(1, loss=1.0)
        assert rep.flush(timeout=5)
        rep.close()
        assert sink.requests == 0 and sink.points == []  # only rank 0 sends
    finally:
        sink.close()


def test_activation_recorder_keeps_the_latest_outputs():
    from deeppod.runtime.metrics import ActivationRecorder

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    rec = ActivationRecorder(model)
    model(torch.randn(5, 4))
    t = rec.tensors()
    assert set(t) == {"activations/0", "activations/1", "activations/2"} and t["activations/2"].shape == (5, 2)
    assert (t["activations/1"] >= 0).all()
    rec.close()
    import pytest

    with pytest.raises(ValueError, match="no module named"):
        ActivationRecorder(model, ["nope"])


def test_batches_stay_under_the_servers_body_limit():
    from deeppod.runtime.metrics import MAX_BATCH_BYTES

    port = free_port()
    sink = Sink(port)
    sizes = []
    orig = sink.server.RequestHandlerClass.do_POST

    def spy(handler):
        sizes.append(int(handler.headers["Content-Length"]))
        orig(handler)

    sink.server.RequestHandlerClass.do_POST = spy
    rep = Reporter(api_url=f"http://127.0.0.1:{port}", token="tok", job_id=1, tb_dir=None, flush_seconds=5,
                   enabled=True)
    try:
        big = {f"weights/layer{i}": torch.randn(1000) for i in range(100)}
        for step in range(100):  # about 2 MB of histograms in all
            rep.histograms(step, big)
        assert rep.flush(timeout=30)
        assert sorted(p["step"] for p in sink.points) == list(range(100))
        assert len(sizes) > 1 and max(sizes) < MAX_BATCH_BYTES * 1.2 < (1 << 20)
    finally:
        rep.close()
        sink.close()


@pytest.mark.parametrize("value, seconds", [(None, 1.0), ("0.2", 0.2), ("0", 0.05), ("soon", 1.0)])
def test_the_send_interval_comes_from_the_job_contract(monkeypatch, value, seconds):
    """A trial's contract asks for sooner sends (its pruner judges each report)."""
    if value is None:
        monkeypatch.delenv("DEEPPOD_METRICS_FLUSH_SECONDS", raising=False)
    else:
        monkeypatch.setenv("DEEPPOD_METRICS_FLUSH_SECONDS", value)
    assert Reporter(api_url="http://127.0.0.1:1", token="t", job_id=1, enabled=False).flush_seconds == seconds


def test_a_trials_report_at_a_step_its_pruner_judges_is_sent_at_once(monkeypatch):
    """With a long send interval, only the reports at the pruner's rungs (1, 3, 9) go at once,
    each in a send of its own; the steps between wait for the interval."""
    monkeypatch.setenv("DEEPPOD_TRIAL_JUDGED", "1,3,9,27")
    monkeypatch.setenv("DEEPPOD_TRIAL", "4")
    port = free_port()
    sink = Sink(port)
    rep = Reporter(api_url=f"http://127.0.0.1:{port}", token="tok", job_id=1, tb_dir=None, flush_seconds=600,
                   enabled=True)
    try:
        rep.report(0, acc=0.1)
        rep.report(1, acc=0.2)  # a rung: sent now, with the step before it
        wait_until(lambda: sink.requests == 1, 30, interval=0.01, what="the rung's report to be sent")
        assert [p["step"] for p in sink.points] == [0, 1] and sink.points[1]["trial"] == 4
        rep.report(2, acc=0.3)
        rep.report(5, acc=0.4)  # past rung 3 (a trial that reports every few steps): sent now
        wait_until(lambda: sink.requests == 2, 30, interval=0.01, what="the report past rung 3")
        rep.report(6, acc=0.5)
        rep.trial = 5  # the process's next trial: its rungs count from its own start
        rep.report(1, acc=0.6)
        wait_until(lambda: sink.requests == 3, 30, interval=0.01, what="the next trial's first rung")
        assert [p["step"] for p in sink.points] == [0, 1, 2, 5, 6, 1]
    finally:
        rep.close()
        sink.close()


@pytest.mark.parametrize("judged, after, step, expected", [
    ("1,3,9", -1, 0, False), ("1,3,9", -1, 1, True), ("1,3,9", 1, 2, False), ("1,3,9", 1, 4, True),
    ("1,3,9", 9, 100, False), ("*", 3, 4, True), ("*", 4, 4, False), ("", -1, 5, False)])
def test_judged_between(judged, after, step, expected):
    from deeppod.contract import judged_between

    assert judged_between(judged, after, step) is expected


def test_a_process_that_exits_while_the_control_plane_restarts_waits_for_it(caplog):
    """A short trial ended while its server restarted: its reports wait at exit for the server
    (a search must not judge without them), not 10 s and then gone."""
    port = free_port()
    rep = Reporter(api_url=f"http://127.0.0.1:{port}", token="tok", job_id=3, tb_dir=None, flush_seconds=0.05,
                   enabled=True)
    for step in range(24):
        rep.report(step, score=step / 24)
    closing = threading.Thread(target=rep.close)
    closing.start()
    wait_until(lambda: any("does not answer: waiting up to" in r.getMessage() for r in caplog.records), 30,
               interval=0.05, what="the exit to wait for the control plane")
    sink = Sink(port)  # the control plane is back
    try:
        closing.join(60)
        assert not closing.is_alive()
        assert sorted(p["step"] for p in sink.points) == list(range(24))
    finally:
        sink.close()


def test_points_a_control_plane_never_took_are_kept_for_the_server(tmp_path, monkeypatch, caplog):
    """Away longer than the wait at exit: the points go to the checkpoint folder (the server
    takes them when the run ends: tests/jobs/test_controller.py), appended run after run; a
    link planted there is not followed."""
    from deeppod.contract import ENV_CHECKPOINT_DIR, METRICS_SPOOL

    monkeypatch.setenv(ENV_CHECKPOINT_DIR, str(tmp_path))
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    for run in range(2):
        rep = Reporter(api_url=url, token="tok", job_id=3, tb_dir=None, flush_seconds=0.05, enabled=True)
        rep.trial = 5 if run else None
        for step in range(10):
            rep.report(step, loss=1.0 / (step + 1))
        rep.close(timeout=0.3)
    lines = [json.loads(line) for line in (tmp_path / METRICS_SPOOL).read_text().splitlines()]
    assert [p["step"] for p in lines] == list(range(10)) * 2 and [p.get("trial") for p in lines[9:11]] == [None, 5]
    assert lines[0]["metrics"] == {"loss": 1.0}
    assert any("kept in" in r.getMessage() for r in caplog.records)

    (tmp_path / METRICS_SPOOL).unlink()
    (tmp_path / METRICS_SPOOL).symlink_to(tmp_path / "elsewhere")
    rep = Reporter(api_url=url, token="tok", job_id=3, tb_dir=None, flush_seconds=0.05, enabled=True)
    rep.report(0, loss=1.0)
    rep.close(timeout=0.3)
    assert not (tmp_path / "elsewhere").exists()
    assert any("not kept" in r.getMessage() for r in caplog.records)


def test_a_stopping_process_waits_for_the_control_plane_only_within_its_grace(tmp_path, monkeypatch):
    """A stop's SIGKILL comes at the grace's end: a control plane that takes the connection and
    never answers must not hold the exit past it (the job would end with -9, not "resume me").
    The points go to the checkpoint folder instead."""
    import socket
    import time

    from deeppod.contract import ENV_CHECKPOINT_DIR, ENV_GRACE, METRICS_SPOOL
    from deeppod.runtime import metrics, stop

    monkeypatch.setenv(ENV_CHECKPOINT_DIR, str(tmp_path))
    monkeypatch.setenv(ENV_GRACE, "6")
    mute = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), never answers
    held = []
    threading.Thread(target=lambda: held.append(mute.accept()), daemon=True).start()
    try:
        rep = Reporter(api_url=f"http://127.0.0.1:{mute.getsockname()[1]}", token="tok", job_id=3, tb_dir=None,
                       flush_seconds=0.05, enabled=True)
        for step in range(5):
            rep.report(step, loss=1.0)
        stop.request_stop("SIGTERM")
        began = time.monotonic()
        rep.close()
        took = time.monotonic() - began
        # 2 s (6 s less the margin): not EXIT_WAIT_S, nor one send's 10 s
        assert took < metrics.SEND_TIMEOUT_S - 2, took
        lines = (tmp_path / METRICS_SPOOL).read_text().splitlines()
        assert [json.loads(line)["step"] for line in lines] == list(range(5))
    finally:
        stop._reset_for_tests()
        mute.close()

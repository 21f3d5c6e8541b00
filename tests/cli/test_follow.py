"""deeppod submit -f while the job waits (issue 71: "submitted: queued" and then nothing for ten
minutes, the reason only in 'deeppod jobs')."""

from rich.console import Console

from deeppod.cli import jobs


class _Queued:
    """A client whose job waits with these reasons, one per poll, then runs."""

    def __init__(self, reasons):
        self.answers = [{"state": "queued", "reason": r} for r in reasons] + [{"state": "running", "reason": ""}]
        self.jobs = self  # client.jobs.get

    def get(self, job_id):
        return self.answers.pop(0)


def test_a_waiting_job_says_why_and_again_only_when_the_reason_changes(monkeypatch):
    said = Console(stderr=True, record=True, width=200)
    monkeypatch.setattr(jobs, "err_console", said)
    c = _Queued(["not enough free CPUs: 2 workers x 1 CPUs, 1 CPUs free",
                 "not enough free CPUs: 2 workers x 1 CPUs, 0 CPUs free",  # counts only: not again
                 "waiting for 2 GPUs (0 free)", ""])
    jobs.say_while_queued(c, 7, poll=0)
    assert said.export_text().splitlines() == [
        "job 7 queued: not enough free CPUs: 2 workers x 1 CPUs, 1 CPUs free",
        "job 7 queued: waiting for 2 GPUs (0 free)",
        "job 7 queued: waiting for its turn"]
    assert c.answers == []  # it returned once the job left the queue


def test_submit_prints_the_servers_warning_that_a_job_can_never_start(monkeypatch):
    said = Console(stderr=True, record=True, width=200)
    monkeypatch.setattr(jobs, "err_console", said)
    jobs.warn_never_fits({"id": 4, "warning": "it can never start as asked: ..."})
    jobs.warn_never_fits({"id": 5, "warning": None})
    assert said.export_text().splitlines() == ["warning: job 4 it can never start as asked: ..."]

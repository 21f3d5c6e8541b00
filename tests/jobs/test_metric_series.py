"""Metric series downsampled by the database, on SQLite and PostgreSQL: at most max_points,
the last point exact, each bucket its last step and the mean of its values."""

from deeppod.jobs import metrics
from deeppod.store.models import JobMetric
from tests.fixtures import populate, submit_job


def test_long_series_are_bucketed_by_the_database(sessions, tmp_path):
    w = populate(sessions)
    job = submit_job(sessions, w.alice, tmp_path)
    with sessions.begin() as s:
        s.add_all(JobMetric(job_id=job, name="loss", step=st, value=float(st % 10)) for st in range(0, 20_000, 2))
        s.add(JobMetric(job_id=job, name="loss", step=19_998, value=42.0))  # a step reported twice: the newest wins
        s.add_all(JobMetric(job_id=job, name="nan", step=st, value=None) for st in range(300))
        s.add_all(JobMetric(job_id=job, name="short", step=st, value=1.0) for st in range(5))
    with sessions() as s:
        out = metrics.series(s, w.alice, job, None, 101)["metrics"]
    loss = out["loss"]
    assert loss["points"] == 10_001 and loss["last"] == [19_998, 42.0] and loss["series"][-1] == [19_998, 42.0]
    assert len(loss["series"]) == 101
    # 100 buckets of 199.98 steps: the first holds steps 0..198 (100 points, values 0,2,4,6,8 repeating)
    assert loss["series"][0] == [198, 4.0]
    steps = [p[0] for p in loss["series"]]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert out["nan"]["series"][0] == [2, None] and len(out["nan"]["series"]) == 101  # no finite value: None
    assert out["short"]["series"] == [[i, 1.0] for i in range(5)]
    with sessions() as s:
        assert set(metrics.series(s, w.alice, job, ["short"], 2)["metrics"]) == {"short"}

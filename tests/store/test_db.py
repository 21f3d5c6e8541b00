"""Sessions: a commit that touches a watched table wakes whoever waits for it."""

from deeppod.store.db import on_commit_of
from deeppod.store.models import Job, Node
from tests.fixtures import populate, submit_job


def test_a_commit_that_adds_a_watched_row_calls_back_once(sessions, tmp_path):
    world = populate(sessions)
    calls = []
    on_commit_of(sessions, (Job,), lambda: calls.append(1))
    with sessions.begin() as s:
        s.query(Node).first().cpus += 1  # another table: no call
    assert calls == []
    jid = submit_job(sessions, world.alice, tmp_path, workers=1)
    assert calls == [1]
    try:
        with sessions.begin() as s:
            s.get(Job, jid).reason = "changed"
            s.flush()
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    assert calls == [1]  # nothing was committed
    with sessions.begin() as s:
        s.get(Job, jid).reason = "changed"
    assert calls == [1, 1]

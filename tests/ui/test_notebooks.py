"""The console's notebooks page: the caller's notebooks with Open once one runs, the start
form (a bad value refused next to its field, nothing started), nothing of another tenant's."""

from deeppod.contract import JobState
from deeppod.store.models import Job
from tests.ui.conftest import Browser


def test_start_a_notebook_from_the_page_and_open_it_once_it_runs(api):
    alice = Browser(api, api.user("alice", "lab"))
    bad = alice.post("/notebooks", {"name": "explore", "idle": "forever", "gpus": "one"})
    assert bad.status_code == 422, bad.text
    assert 'id="e-idle"' in bad.text and 'id="e-gpus"' in bad.text and 'value="forever"' in bad.text
    assert alice.get("/v1/notebooks", headers=api.as_(api.admin)).json() == []
    started = alice.post("/notebooks", {"name": "explore", "idle": "45m", "gpus": "1"})
    assert started.status_code == 303 and started.headers["location"] == "/notebooks"
    nb = api.http.get("/v1/notebooks", headers=api.as_(api.admin)).json()[0]
    assert (nb["name"], nb["idle_limit_seconds"], nb["gpus_per_worker"]) == ("explore", 2700, 1)
    page = alice.get("/notebooks").text
    assert f'data-notebook="{nb["id"]}"' in page and "45m" in page and f"open-{nb['id']}" not in page  # queued
    with api.ctx.sessions.begin() as s:
        s.get(Job, nb["id"]).state = JobState.RUNNING
    page = alice.get("/notebooks").text
    assert f'id="open-{nb["id"]}" href="/notebooks/{nb["id"]}/lab"' in page

    eve = Browser(api, api.user("eve", "other"))
    assert f'data-notebook="{nb["id"]}"' not in eve.get("/notebooks").text

"""The template filters every page shares."""

from deeppod.contract import JobState
from deeppod.states import DeploymentState
from deeppod.ui.render import env


def test_every_state_gets_a_badge_with_a_colour_and_searches_and_deployments_borrow_a_jobs():
    badge = env.filters["badge"]
    assert badge(JobState.RUNNING) == "s-running" and badge("failed") == "s-failed"
    assert badge("completed") == "s-succeeded"  # a search
    assert badge(DeploymentState.READY) == "s-succeeded" and badge(DeploymentState.FAILED) == "s-failed"
    assert badge(DeploymentState.DEGRADED) == "s-queued" and badge("no such state") == "s-queued"
    css = (env.loader.searchpath[0] + "/../static/console.css")
    colours = open(css).read()
    for state in JobState:
        if badge(state) != "s-queued":
            assert "." + badge(state) in colours, state

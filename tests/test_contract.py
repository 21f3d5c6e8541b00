"""The job contract shared by the server, the CLI, the SDK and code inside jobs."""

from deeppod.contract import ACTIVE_STATES, FINAL_STATES, HOLDING_STATES, JobState


def test_every_state_is_either_active_or_final():
    assert ACTIVE_STATES | FINAL_STATES == set(JobState) and not ACTIVE_STATES & FINAL_STATES
    assert HOLDING_STATES < ACTIVE_STATES and JobState.QUEUED not in HOLDING_STATES


def test_a_resize_is_its_own_state_and_holds_its_resources():
    assert JobState.RESIZING != JobState.PREEMPTED
    assert JobState.RESIZING.holds_resources and JobState.PREEMPTED.holds_resources
    assert not JobState.QUEUED.holds_resources


def test_is_final_and_plain_string_values():
    assert [s for s in JobState if s.is_final] == [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                                                   JobState.STOPPED]
    # what the API returns and clients compare against
    assert JobState.STOPPED == "stopped" and f"{JobState.STOPPED}" == "stopped" and str(JobState.QUEUED) == "queued"
    assert "stopped" in FINAL_STATES  # a client's plain string finds its set

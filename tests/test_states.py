"""The resources' lifecycles (states.py): every state a store row, the API or a loop uses is
a member, and the named sets hold what their names say."""

import ast

from deeppod.states import ACTIVE_EXPERIMENTS, LIVE_TRIALS, DeploymentState, ExperimentState, TrialState
from tests.helpers import ROOT


def test_the_named_sets():
    assert ACTIVE_EXPERIMENTS == {ExperimentState.RUNNING, ExperimentState.STOPPING}
    assert LIVE_TRIALS == {TrialState.RUNNING, TrialState.PRUNING, TrialState.PAUSING}
    assert TrialState.PAUSED not in LIVE_TRIALS  # kept by its process, followed by nothing until promoted
    assert "running" in LIVE_TRIALS and "completed" not in LIVE_TRIALS  # plain values from the store match


def test_no_state_is_written_as_a_bare_string_in_the_loops_that_set_them():
    """A typo in a literal ('complete') would be a state nobody waits for: the experiment and rollout
    code assign members only."""
    values = {s.value for s in (*ExperimentState, *TrialState, *DeploymentState)}
    offenders = []
    for rel in ("experiments/controller.py", "experiments/service.py", "deployments/rollout.py",
                "deployments/service.py"):
        tree = ast.parse((ROOT / "src" / "deeppod" / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, (ast.Attribute, ast.Tuple)) and "state" in ast.unparse(t) for t in node.targets):
                for c in ast.walk(node.value):
                    if isinstance(c, ast.Constant) and c.value in values:
                        offenders.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    assert offenders == []

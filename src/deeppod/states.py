"""The lifecycles of the resources built on jobs: search experiments and their trials, and
deployments. Each a StrEnum with named sets, as ``contract.JobState`` is for jobs; the
values are what the API, the SDK and the CLI show. Standard library only (the SDK uses it).
"""

from __future__ import annotations

from enum import StrEnum


class ExperimentState(StrEnum):
    """running -> stopping -> stopped (resumable) ; running -> completed | failed"""

    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"


ACTIVE_EXPERIMENTS = frozenset({ExperimentState.RUNNING, ExperimentState.STOPPING})


class TrialState(StrEnum):
    """running -> pruning -> pruned ; running -> completed | failed | stopped (resumed with its
    experiment); with promotion (asha-promote) running -> pausing -> paused -> running (promoted)
    or pruned (never promoted)"""

    RUNNING = "running"
    PRUNING = "pruning"
    PAUSING = "pausing"  # its process stops it at a rung and keeps its state
    PAUSED = "paused"  # kept by its process until promoted or pruned
    COMPLETED = "completed"
    PRUNED = "pruned"
    FAILED = "failed"
    STOPPED = "stopped"


LIVE_TRIALS = frozenset({TrialState.RUNNING, TrialState.PRUNING, TrialState.PAUSING})


class DeploymentState(StrEnum):
    """deploying -> ready | degraded -> updating (a new version rolls out) -> ready ...;
    failed when the requested version's replicas keep failing to start."""

    DEPLOYING = "deploying"
    READY = "ready"
    DEGRADED = "degraded"
    UPDATING = "updating"
    FAILED = "failed"

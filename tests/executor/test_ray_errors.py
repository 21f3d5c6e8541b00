"""The Ray executor's clear errors, without a cluster: an address nobody answers at, a Ray
too old, a node that does not see the job's folder (no shared storage)."""

import socket

import pytest

ray = pytest.importorskip("ray")

from deeppod.errors import ExecutorError  # noqa: E402
from deeppod.executor import ray as ray_executor  # noqa: E402


def test_an_address_nobody_answers_at_is_refused_with_what_to_do():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ExecutorError, match=f"no Ray cluster answers at 127.0.0.1:{port}: start one with "
                                            "'ray start --head'"):
        ray_executor.RayExecutor(f"127.0.0.1:{port}")
    with pytest.raises(ExecutorError, match="no Ray cluster answers at nonsense"):
        ray_executor.RayExecutor("nonsense")


def test_a_ray_too_old_is_refused_with_the_version_to_install(monkeypatch):
    monkeypatch.setattr(ray, "__version__", "2.40.1")
    with pytest.raises(ExecutorError, match=r"Ray 2.40.1 is too old: DeepPod needs Ray >= 2.55"):
        ray_executor.RayExecutor("127.0.0.1:6379")


def test_a_node_that_does_not_see_the_job_folder_says_so(tmp_path):
    job_dir = tmp_path / "jobs" / "7"
    job_dir.mkdir(parents=True)
    agent = ray_executor._Agent()
    why = agent.start(str(job_dir), [0], 0, "a-nonce-the-server-wrote")
    assert why.startswith(f"the job folder {job_dir} is not visible on node {socket.gethostname()}")
    assert "docs/cluster.md" in why and not agent.alive()
    (job_dir / "shared-check").write_text("another-server-or-an-old-run")  # a different folder at that path
    assert "is not visible" in agent.start(str(job_dir), [0], 0, "a-nonce-the-server-wrote")

"""Deployments through the store: replicas are started with the control plane's limits."""

import pytest

from deeppod.deployments import service
from deeppod.deployments.balancer import Balancer
from deeppod.deployments.controller import DeploymentController
from deeppod.models import service as model_service
from deeppod.serve import replica
from deeppod.store.models import Job
from tests.fixtures import populate
from tests.models.test_service import artifact


@pytest.fixture
def deployed(sessions, tmp_path):
    world = populate(sessions)
    with sessions.begin() as s:
        model_service.register(s, world.alice, "pets", root=tmp_path / "models", jobs_dir=tmp_path / "jobs",
                          path=str(artifact(tmp_path / "art")))
        service.create(s, world.alice, "pets", "pets@1", replicas=2)
    return sessions, tmp_path / "models"


def replica_jobs(sessions) -> list[Job]:
    with sessions() as s:
        return list(s.query(Job).filter(Job.kind == "serve"))


def test_replicas_take_the_predict_body_limit_and_the_grace_the_server_has(deployed):
    sessions, models = deployed
    DeploymentController(sessions, Balancer(), models_root=models, health=lambda url: False,
                         default_grace=7.0, max_body_bytes=64 << 20).tick()
    replicas = replica_jobs(sessions)
    assert len(replicas) == 2
    for job in replicas:
        args = replica.parse_args(job.command[job.command.index("deeppod.serve.replica") + 1:])
        assert args.max_body_bytes == 64 << 20
        assert job.grace_seconds == 7.0  # DEEPPOD_GRACE_SECONDS, not a number of its own


def test_a_replica_started_by_hand_takes_the_servers_default_limit():
    from deeppod.settings import Settings

    assert replica.parse_args(["--model-dir", "m"]).max_body_bytes == Settings().predict_max_bytes


@pytest.mark.slow  # it starts processes
def test_the_server_wires_DEEPPOD_PREDICT_MAX_BYTES_to_the_controller(tmp_path):
    from deeppod.cluster.gpus import LogicalProbe
    from deeppod.executor.fake import FakeExecutor
    from deeppod.server import build
    from deeppod.settings import Settings

    settings = Settings.from_env({"DEEPPOD_HOME": str(tmp_path), "DEEPPOD_PREDICT_MAX_BYTES": str(40 << 20)})
    ctx = build(settings, executor=FakeExecutor(), probe=LogicalProbe(1))
    try:
        assert ctx.deployments.max_body_bytes == 40 << 20
    finally:
        ctx.engine.dispose()

"""Direct tokens through the store (SQLite and PostgreSQL): who gets one, and which a
replica's sync hears are revoked."""

from dataclasses import replace
from datetime import timedelta

import pytest

from deeppod.auth import roles
from deeppod.auth import service as auth
from deeppod.deployments import direct, service
from deeppod.deployments.balancer import Balancer
from deeppod.deployments.controller import DeploymentController
from deeppod.deployments.direct_key import deployment_key
from deeppod.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthenticated
from deeppod.models import service as model_service
from deeppod.serve.direct import open_token
from deeppod.store.models import DirectToken, Job, utcnow
from tests.fixtures import populate, submit_job
from tests.models.test_service import artifact


@pytest.fixture
def world(sessions, tmp_path):
    w = populate(sessions)
    with sessions.begin() as s:
        model_service.register(s, w.alice, "pets", root=tmp_path / "models", jobs_dir=tmp_path / "jobs",
                               path=str(artifact(tmp_path / "art")))
        service.create(s, w.alice, "pets", "pets@1", replicas=1)
    DeploymentController(sessions, Balancer(), models_root=tmp_path / "models", health=lambda url: False,
                         default_grace=5.0, max_body_bytes=1 << 20).tick()
    return sessions, w


def replica_principal(sessions, w):
    with sessions() as s:
        job = s.query(Job).filter(Job.kind == "serve").one()
        return replace(w.alice, job_id=job.id, scope=roles.REPLICA), job


def issue(sessions, **kw):
    with sessions.begin() as s:
        issued, _ = direct.issue(s, "pets", **kw)
        return issued


def sync(sessions, w) -> list[str]:
    p, job = replica_principal(sessions, w)
    with sessions.begin() as s:
        return direct.sync(s, p, job.id)[1]


def test_a_replica_gets_its_deployments_key_and_a_token_opens_with_it_alone(world):
    sessions, w = world
    _, job = replica_principal(sessions, w)
    env = job.env
    issued = issue(sessions, secret=w.alice_token)
    claims = open_token(bytes.fromhex(env["DEEPPOD_DIRECT_KEY"]), issued.token)
    assert claims["d"] == int(env["DEEPPOD_DEPLOYMENT_ID"]) == issued.deployment.id
    assert claims["j"] == issued.jti and claims["u"] == "alice" and claims["t"] == "a"
    assert open_token(deployment_key(issued.deployment.id + 1), issued.token) is None


def test_asking_again_gets_the_same_token_until_half_its_life_is_gone(world):
    sessions, w = world
    a, b = issue(sessions, secret=w.alice_token), issue(sessions, secret=w.alice_token)
    assert a.token == b.token
    assert issue(sessions, secret=w.alice_token, ttl=1200).jti != a.jti  # 600 s left is under half of 1200


def test_who_may_not_predict_gets_no_token(world):
    sessions, w = world
    with pytest.raises(NotFound):  # another tenant's deployment is not there for bob
        issue(sessions, secret=w.bob_token)
    with pytest.raises(Unauthenticated):
        issue(sessions, secret="nonsense")
    with pytest.raises(Unauthenticated):
        issue(sessions)
    with pytest.raises(Unauthenticated):
        issue(sessions, key="dpk_unknown")
    with sessions.begin() as s:
        _, read_only = auth.create_token(s, w.alice, "ro", scope=roles.READ)
    with pytest.raises(Forbidden):
        issue(sessions, secret=read_only)
    with pytest.raises(InvalidRequest, match="ttl_seconds"):
        issue(sessions, secret=w.alice_token, ttl=0)


def test_revoking_a_key_revokes_its_direct_tokens_at_the_next_sync(world):
    sessions, w = world
    with sessions.begin() as s:
        key, secret = service.create_key(s, w.alice, "pets")
        key_id = key.id
    by_key, by_user = issue(sessions, key=secret), issue(sessions, secret=w.alice_token)
    assert sync(sessions, w) == []
    with sessions.begin() as s:
        service.revoke_key(s, w.alice, "pets", key_id)
    assert sync(sessions, w) == [by_key.jti]
    with pytest.raises(Unauthenticated):
        issue(sessions, key=secret)
    assert by_user.jti not in sync(sessions, w)


def test_revoking_a_user_token_revokes_its_direct_tokens(world):
    sessions, w = world
    with sessions.begin() as s:
        tok, secret = auth.create_token(s, w.alice, "client")
        tok_id = tok.id
    issued = issue(sessions, secret=secret)
    assert sync(sessions, w) == []
    with sessions.begin() as s:
        auth.revoke_token(s, w.alice, tok_id)
    assert sync(sessions, w) == [issued.jti]


def test_revoke_all_and_expired_tokens_are_not_listed(world):
    sessions, w = world
    short = issue(sessions, secret=w.alice_token, ttl=1)
    with sessions.begin() as s:
        key, secret = service.create_key(s, w.alice, "pets")
    by_key = issue(sessions, key=secret)
    with sessions.begin() as s:
        assert direct.revoke_all(s, w.alice, "pets") == 2
        row = s.query(DirectToken).filter_by(jti=short.jti).one()
        row.expires_at = utcnow() - timedelta(seconds=1)  # an expired token's revocation needs no telling
    assert sync(sessions, w) == [by_key.jti]


def test_only_the_replica_itself_syncs(world):
    sessions, w = world
    p, job = replica_principal(sessions, w)
    with sessions.begin() as s, pytest.raises(Forbidden):
        direct.sync(s, replace(p, job_id=job.id + 100), job.id)
    batch = submit_job(sessions, w.alice, "/tmp")
    with sessions.begin() as s, pytest.raises(Conflict):
        direct.sync(s, replace(p, job_id=batch), batch)

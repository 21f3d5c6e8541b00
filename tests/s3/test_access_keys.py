"""S3 access keys in the store (SQLite and PostgreSQL): a key acts for its user, its secret is
derived and stored nowhere, and a revoked, expired or read-only key holds no more than that."""

from datetime import timedelta

import pytest
from sqlalchemy import select

from deeppod.auth import roles
from deeppod.auth.service import Principal
from deeppod.errors import Forbidden, InvalidRequest, NotFound, S3Error
from deeppod.s3 import access_keys
from deeppod.store.models import AccessKey, utcnow
from tests.fixtures import populate


def test_a_key_acts_for_its_user_and_its_secret_is_stored_nowhere(sessions):
    world = populate(sessions)
    with sessions.begin() as s:
        key, secret = access_keys.create(s, world.alice, name="camera")
        assert key.key_id.startswith("DPK") and len(key.key_id) == 20 and len(secret) == 40
    with sessions() as s:
        who, again = access_keys.holder(s, key.key_id)
        row = s.scalar(select(AccessKey))
        assert again == secret and who.writes and who.principal.user == "alice" and who.principal.tenant == "a"
        assert secret not in repr(vars(row))
        assert [k.key_id for k in access_keys.list_keys(s, world.alice)] == [key.key_id]
        assert access_keys.list_keys(s, world.bob) == []


def test_revoked_expired_and_unknown_keys_are_invalid(sessions):
    world = populate(sessions)
    with sessions.begin() as s:
        key, _ = access_keys.create(s, world.alice)
        old, _ = access_keys.create(s, world.alice, expires_in=60)
        s.get(AccessKey, old.id).expires_at = utcnow() - timedelta(seconds=1)
    with sessions.begin() as s:
        with pytest.raises(NotFound):
            access_keys.revoke(s, world.bob, key.key_id)  # another tenant's key is not there for bob
        access_keys.revoke(s, world.alice, key.key_id)
    with sessions() as s:
        for key_id in (key.key_id, old.key_id, "DPKNOSUCHKEY00000000"):
            with pytest.raises(S3Error) as e:
                access_keys.holder(s, key_id)
            assert e.value.code == "InvalidAccessKeyId" and e.value.status == 403


def test_read_only_keys_and_who_may_make_which(sessions):
    world = populate(sessions)
    with sessions.begin() as s:
        ro, _ = access_keys.create(s, world.alice, scope="read")
        assert not access_keys.holder(s, ro.key_id)[0].writes
        with pytest.raises(InvalidRequest):
            access_keys.create(s, world.alice, scope="admin")
        read_token = Principal(**{**vars(world.alice), "scope": roles.READ})
        with pytest.raises(Forbidden):
            access_keys.create(s, read_token)  # a read-only token makes read-only keys only
        access_keys.create(s, read_token, scope="read")
        job = Principal(**{**vars(world.alice), "job_id": 7})
        with pytest.raises(Forbidden):
            access_keys.create(s, job, scope="read")


def test_a_key_ends_with_the_token_it_was_made_with(sessions):
    """Issue 70: keys outlived the token that made them. A key made with a token expires no
    later than it, and stops working when it is revoked; one made by the platform (no token),
    or with a token that holds, goes on."""
    from deeppod.auth.service import authenticate, create_token, revoke_token

    world = populate(sessions)
    with sessions.begin() as s:
        short, short_secret = create_token(s, world.alice, "for an hour", expires_in=3600)
        lasting, lasting_secret = create_token(s, world.alice, "lasting")
    with sessions.begin() as s:
        by_short = authenticate(s, short_secret)
        assert by_short.token_id == short.id and by_short.token_expires_at == short.expires_at
        asked_a_year, _ = access_keys.create(s, by_short, expires_in=366 * 86400)
        unbounded, _ = access_keys.create(s, by_short)
        other, _ = access_keys.create(s, authenticate(s, lasting_secret))
        platform, _ = access_keys.create(s, world.alice)
    assert asked_a_year.expires_at == unbounded.expires_at == short.expires_at  # not a year, not never
    with sessions() as s:
        for key in (asked_a_year, unbounded, other, platform):
            access_keys.holder(s, key.key_id)  # all hold while their tokens do
    with sessions.begin() as s:
        revoke_token(s, world.alice, short.id)
    with sessions() as s:
        for key in (asked_a_year, unbounded):
            with pytest.raises(S3Error, match="token this access key was made with was revoked or expired") as e:
                access_keys.holder(s, key.key_id)
            assert e.value.code == "InvalidAccessKeyId"
        access_keys.holder(s, other.key_id)
        access_keys.holder(s, platform.key_id)
    with sessions.begin() as s:
        s.get(type(lasting), lasting.id).expires_at = utcnow() - timedelta(seconds=1)
    with sessions() as s, pytest.raises(S3Error):
        access_keys.holder(s, other.key_id)

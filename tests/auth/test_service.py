import pytest
from sqlalchemy import select

from deeppod.auth import service as auth
from deeppod.auth.tokens import hash_secret
from deeppod.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthenticated
from deeppod.store.models import Token
from tests.fixtures import populate


def test_bootstrap_happens_once(sessions):
    with sessions.begin() as s:
        first = auth.bootstrap(s)
        assert first and first.startswith("dp_")
        assert auth.bootstrap(s) is None
        me = auth.authenticate(s, first)
        assert me.is_admin and me.user == "admin" and me.tenant == "default"


def test_tokens_are_stored_hashed(sessions):
    world = populate(sessions)
    with sessions() as s:
        stored = [t.token_hash for t in s.scalars(select(Token))]
    for secret in (world.admin_token, world.alice_token, world.bob_token):
        assert secret not in stored
        assert hash_secret(secret) in stored
    assert all(len(h) == 64 for h in stored)


def test_unknown_missing_and_revoked_tokens_are_refused(sessions):
    world = populate(sessions)
    with sessions.begin() as s:
        with pytest.raises(Unauthenticated):
            auth.authenticate(s, None)
        with pytest.raises(Unauthenticated):
            auth.authenticate(s, "dp_nope")
        token, secret = auth.create_token(s, world.alice, "ci")
        assert auth.authenticate(s, secret).user == "alice"
        auth.revoke_token(s, world.alice, token.id)
        with pytest.raises(Unauthenticated):
            auth.authenticate(s, secret)


def test_only_admins_manage_tenants_and_users(sessions):
    world = populate(sessions)
    with sessions.begin() as s:
        with pytest.raises(Forbidden):
            auth.create_tenant(s, world.alice, "c")
        with pytest.raises(Forbidden):
            auth.create_user(s, world.alice, "carol", "a")
        with pytest.raises(Forbidden):
            auth.create_token(s, world.alice, user="bob")
        with pytest.raises(Conflict):
            auth.create_tenant(s, world.admin, "a")
        with pytest.raises(NotFound):
            auth.create_user(s, world.admin, "carol", "nope")
        with pytest.raises(InvalidRequest):
            auth.create_tenant(s, world.admin, "Bad Name!")
        _, secret = auth.create_token(s, world.admin, user="bob")
        assert auth.authenticate(s, secret).user == "bob"
        assert [t.name for t in auth.list_tenants(s, world.alice)] == ["a"]
        assert {t.name for t in auth.list_tenants(s, world.admin)} == {"a", "b", "default"}
        assert {u.name for u, _ in auth.list_users(s, world.bob)} == {"bob"}


def test_users_revoke_only_their_own_tokens(sessions):
    world = populate(sessions)
    with sessions.begin() as s:
        token, _ = auth.create_token(s, world.bob, "mine")
        with pytest.raises(Forbidden):
            auth.revoke_token(s, world.alice, token.id)
        auth.revoke_token(s, world.admin, token.id)

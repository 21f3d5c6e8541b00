"""Console sessions in the store, on SQLite and PostgreSQL."""

from datetime import timedelta

import pytest

from deeppod.auth import service as auth
from deeppod.errors import Unauthenticated
from deeppod.store.models import Token, utcnow
from deeppod.ui import sessions as console
from tests.fixtures import populate


def test_a_session_stands_for_its_token_until_signed_out(sessions):
    w = populate(sessions)
    with sessions.begin() as s:
        secret, who = console.sign_in(s, f"  {w.alice_token}\n")
    assert who.principal.user == "alice" and secret != w.alice_token
    with sessions() as s:
        again = console.signed_in(s, secret)
    assert again.principal == who.principal and again.csrf == who.csrf
    assert console.csrf_ok(who.csrf, who.csrf) and not console.csrf_ok(who.csrf, None)
    with sessions.begin() as s:
        console.sign_out(s, secret)
    with sessions() as s, pytest.raises(Unauthenticated, match="sign in again"):
        console.signed_in(s, secret)


def test_a_session_never_outlives_its_token(sessions):
    w = populate(sessions)
    with sessions.begin() as s:
        _, token = auth.create_token(s, w.alice, "short", expires_in=300)
        _, who = console.sign_in(s, token)
    assert who.expires_at <= utcnow() + timedelta(minutes=5)
    with sessions.begin() as s:
        secret, _ = console.sign_in(s, w.bob_token)
        for t in s.query(Token).filter(Token.user_id == w.bob.user_id):
            t.revoked_at = utcnow()
    with sessions() as s, pytest.raises(Unauthenticated, match="revoked or expired"):
        console.signed_in(s, secret)


def test_unknown_cookies_are_nobody(sessions):
    populate(sessions)
    with sessions() as s:
        for cookie in (None, "", "forged"):
            with pytest.raises(Unauthenticated):
                console.signed_in(s, cookie)

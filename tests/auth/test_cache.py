"""The predict path's token cache: answers from memory, refreshes ahead, forgets a revoked
token within its ttl."""

import pytest

from deeppod.auth import service as auth
from deeppod.auth.cache import PrincipalCache
from deeppod.errors import Unauthenticated
from tests.fixtures import Clock, populate


def test_a_token_in_use_is_refreshed_ahead_and_a_revoked_one_is_refused_within_the_ttl(sessions):
    world = populate(sessions)
    with sessions.begin() as s:
        token, secret = auth.create_token(s, world.alice, "predict")
        token_id = token.id
    clock = Clock()
    cache = PrincipalCache(sessions, ttl=0.5, clock=clock)
    assert cache.cached(secret) is False  # never seen: look it up
    assert cache.lookup(secret).user == "alice"
    clock.t += 0.1
    assert cache.cached(secret).user == "alice" and not cache.claim_refresh(secret)  # fresh: nothing to do
    clock.t += 0.2  # past half its life: one caller refreshes it, the others keep answering from memory
    assert cache.claim_refresh(secret) and not cache.claim_refresh(secret)
    with sessions.begin() as s:
        auth.revoke_token(s, world.alice, token_id)
    cache.refresh(secret)
    assert cache.cached(secret) is None  # the refresh saw the revocation: refused from memory
    clock.t += 1.0
    assert cache.cached(secret) is False
    with pytest.raises(Unauthenticated):
        cache.lookup(secret)

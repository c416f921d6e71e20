"""Buckets a client names cannot push its own spent bucket out of the workers' shared table.

The table keeps buckets in sets of eight, and a new bucket in a full set
takes the place of the one that will be full soonest: a spent key's. When a
bucket's set was an unkeyed hash of its name, a client could work out eight
account names whose sign-in buckets share its key's set, try to sign in as
each, and have a full bucket again whenever it liked.
"""

from __future__ import annotations

import hashlib
import itertools
import uuid

import pytest

from accounts import admission, ratelimit
from accounts.auth import AuthContext
from accounts.ratelimit import SharedMemoryRateLimiter
from core import sharedstate
from core.sharedstate import SharedState


@pytest.fixture
def workers_state(tmp_path, monkeypatch):
    """This process as one of a server's workers: their shared table is its rate limiter."""
    shared = SharedState.create(str(tmp_path), buckets=1024)
    monkeypatch.setenv(sharedstate.ENV, str(shared.path))
    sharedstate.reset()
    ratelimit.reset_rate_limiter()
    assert isinstance(ratelimit.get_rate_limiter(), SharedMemoryRateLimiter)
    yield shared
    ratelimit.reset_rate_limiter()
    sharedstate.reset()
    shared.remove()


def _sharing_a_set_unkeyed(rate_key: str, buckets: int, address: str, count: int) -> list[str]:
    """Account names whose sign-in buckets an unkeyed BLAKE2b puts in ``rate_key``'s set.

    What a client could work out offline (about 8,000 hashes here, 130,000 at
    the real size) while the table placed buckets so.
    """

    def set_of(name: str) -> int:
        digest = hashlib.blake2b(name.encode(), digest_size=16).digest()
        return int.from_bytes(digest[:8], "little") % buckets

    target, found = set_of(rate_key), []
    for n in itertools.count():
        account = f"x{n}@example.com"  # as admission folds it already
        who = hashlib.sha256(account.encode()).hexdigest()[:32]
        if set_of(f"sign-in:{address}:{who}") == target:
            found.append(account)
            if len(found) == count:
                return found
    raise AssertionError("unreachable")


def test_sign_in_attempts_for_chosen_accounts_do_not_refill_a_spent_key(workers_state, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "free": (10, 60)}
    settings.SIGN_IN_RATE_LIMIT = (10, 3600)
    caller = AuthContext(user_id=uuid.uuid4(), api_key_id=uuid.uuid4(), tier="free")
    assert [admission.admit(caller).allowed for _ in range(11)] == [True] * 10 + [False]
    accounts = _sharing_a_set_unkeyed(caller.rate_key, workers_state.buckets, "203.0.113.7", 8)

    # Eight sign-ins filled the key's set; the spent key's bucket, full again
    # soonest, made way, and the key started again with a full one.
    for account in accounts:
        assert admission.sign_in("203.0.113.7", account) == 0

    assert not admission.admit(caller).allowed

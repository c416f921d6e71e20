"""A key issued while its user's tier changes ends at the user's final tier.

A request for a key read the user's Pro tier; an MCPize delivery lowering the
user to Free committed; then the request inserted its key, at Pro. The
delivery's update of the user's keys had not seen it, and a cancelled
subscription sends nothing later: the key kept Pro's quota and rate for good.

Each test forces the interleaving. It holds the lock that serialises a user's
key issuing, so the request stops there; sends the tier change; lets go once
both wait (before the fix the tier change never waited, and was done).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from django.db import connection, connections
from django.test import Client

from accounts.models import ApiKey, User
from accounts.tests.api_client import call
from billing.tests.test_mcpize_webhook import SECRET as MCPIZE_SECRET
from billing.tests.test_mcpize_webhook import post as mcpize
from core import tenancy

LOCK = "hashtextextended(%s, 1)"


def _superuser() -> psycopg.Connection:
    params = connection.get_connection_params()
    return psycopg.connect(
        host=params["host"], port=params.get("port"), dbname=params["dbname"], user="postgres"
    )


@pytest.fixture
def keys_lock(cast) -> Iterator[psycopg.Connection]:
    """Alice's key-issuing lock, held on a connection of its own until the test lets go."""
    with _superuser() as holder:
        holder.autocommit = True
        holder.execute(f"SELECT pg_advisory_lock({LOCK})", [f"keys:{cast.alice.id}"])
        yield holder


def _waiters(monitor: psycopg.Connection) -> int:
    row = monitor.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    ).fetchone()
    return row[0] if row else 0


class Step(threading.Thread):
    """One request on a thread and connections of its own; ``answered`` holds its status."""

    def __init__(self, send: Callable[[], int]) -> None:
        super().__init__()
        self.send = send
        self.answered: list[int] = []

    def run(self) -> None:
        try:
            self.answered.append(self.send())
        finally:
            connections.close_all()

    def begin(self, monitor: psycopg.Connection, waiters: int) -> Step:
        """Start, and return once this request waits at a lock (the ``waiters``-th) or is done."""
        self.start()
        deadline = time.monotonic() + 10
        while self.is_alive() and _waiters(monitor) < waiters and time.monotonic() < deadline:
            time.sleep(0.02)
        return self


def _live_tiers(user: User) -> list[str]:
    with tenancy.operator():
        return list(
            ApiKey.objects.filter(user=user, revoked_at__isnull=True)
            .order_by("created_at")
            .values_list("tier", flat=True)
        )


def _lower_by_mcpize(cast, admin_client) -> Callable[[], int]:
    return lambda: mcpize(Client(), {"userId": str(cast.alice.id), "tier": "free"}).status_code


def _lower_in_the_admin(cast, admin_client) -> Callable[[], int]:
    url = f"/admin/accounts/user/{cast.alice.id}/change/"
    form = admin_client.get(url).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k != "password"}
    data.update(tier="free", groups=[], user_permissions=[])
    data["created_at_0"], data["created_at_1"] = "2026-01-01", "00:00:00"
    return lambda: admin_client.post(url, data).status_code


def _issue_by_api(cast) -> Callable[[], int]:
    raw = cast.alice_key.raw
    return lambda: call(Client(), "POST", "/api/keys", raw, {"name": "new"}).status_code


def _issue_on_the_dashboard(cast) -> Callable[[], int]:
    browser = Client()
    browser.force_login(cast.alice)
    # The form offers Pro, the tier the page was drawn at, and asks for it.
    return lambda: browser.post("/keys/", {"name": "new", "tier": "pro"}).status_code


@pytest.fixture(autouse=True)
def alice_on_pro(cast, settings) -> None:
    settings.MCPIZE_BILLING_WEBHOOK_SECRET = MCPIZE_SECRET
    assert mcpize(Client(), {"userId": str(cast.alice.id), "tier": "pro"}).status_code == 200
    assert set(_live_tiers(cast.alice)) == {"pro"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("lower", [_lower_by_mcpize, _lower_in_the_admin])
@pytest.mark.parametrize("issue", [_issue_by_api, _issue_on_the_dashboard])
def test_a_key_requested_before_a_downgrade_commits_ends_at_the_new_tier(
    cast, admin_client, keys_lock, lower, issue
):
    lowering = lower(cast, admin_client)

    issued = Step(issue(cast)).begin(keys_lock, 1)
    lowered = Step(lowering).begin(keys_lock, 2)
    keys_lock.execute(f"SELECT pg_advisory_unlock({LOCK})", [f"keys:{cast.alice.id}"])
    issued.join(20)
    lowered.join(20)

    assert issued.answered in ([201], [200]) and lowered.answered in ([200], [302])
    assert User.objects.get(id=cast.alice.id).tier == "free"
    # The request went first, so its key was made, at Pro; the tier change then lowered it.
    assert _live_tiers(cast.alice) == ["free", "free", "free"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("lower", [_lower_by_mcpize, _lower_in_the_admin])
@pytest.mark.parametrize("issue", [_issue_by_api, _issue_on_the_dashboard])
def test_a_key_requested_while_a_downgrade_commits_gets_no_more_than_the_new_tier(
    cast, admin_client, keys_lock, lower, issue
):
    lowering = lower(cast, admin_client)

    lowered = Step(lowering).begin(keys_lock, 1)
    issued = Step(issue(cast)).begin(keys_lock, 2)
    keys_lock.execute(f"SELECT pg_advisory_unlock({LOCK})", [f"keys:{cast.alice.id}"])
    lowered.join(20)
    issued.join(20)

    assert lowered.answered in ([200], [302]) and issued.answered in ([201], [200])
    assert User.objects.get(id=cast.alice.id).tier == "free"
    # Made at Free (the API's default, the caller's key now Free), or refused (the
    # dashboard asked for Pro, above the tier the user now has): never Pro.
    assert set(_live_tiers(cast.alice)) == {"free"}

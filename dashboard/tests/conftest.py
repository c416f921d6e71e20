from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from accounts.models import Agent, User
from billing.models import UsageEvent
from core import tenancy

# The signed-in user's pages and an operator's admin pages, for checks that
# hold on every page (the Content-Security-Policy, in a browser and not).
DASHBOARD_PAGES = (
    "/usage/",
    "/keys/",
    "/agents/",
    "/connections/",
    "/memories/",
    "/memories/changes/",
    "/plan/",
    "/password_change/",
)
ADMIN_PAGES = (
    "/admin/",
    "/admin/accounts/user/",
    "/admin/accounts/user/add/",
    "/admin/accounts/apikey/",
    "/admin/accounts/apikey/add/",
    "/admin/memories/memory/",
    "/admin/billing/usageevent/",
    "/admin/oauth/application/add/",
)


def record(
    user: User,
    tool: str,
    *,
    when: datetime | None = None,
    latency_ms: int = 10,
    error_code: str | None = None,
    agent: Agent | None = None,
) -> None:
    with tenancy.tenant(user.id):
        UsageEvent.objects.create(
            user=user,
            agent=agent,
            request_id="r",
            tool_name=tool,
            latency_ms=latency_ms,
            success=error_code is None,
            error_code=error_code,
            occurred_at=when or timezone.now(),
        )


def days_ago(n: int) -> datetime:
    return timezone.now() - timedelta(days=n)


@pytest.fixture
def alice_client(cast, client):
    client.force_login(cast.alice)
    return client


@pytest.fixture
def charlie_client(cast):
    from django.test import Client

    other = Client()
    other.force_login(cast.charlie)
    return other

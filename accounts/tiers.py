"""Tiers, from the least to the most capable.

Billing sells Free, Starter, Pro and Team, and its webhooks move users among
them. Unlimited is not sold: an operator grants it (the first user
`recall serve` creates has it by default, see ``RECALL_ADMIN_TIER``), it has
no rate limit and no memory quota, and no billing webhook changes it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Tier(models.TextChoices):
    FREE = "free", "Free"
    STARTER = "starter", "Starter"
    PRO = "pro", "Pro"
    TEAM = "team", "Team"
    UNLIMITED = "unlimited", "Unlimited"


ORDER = [Tier.FREE, Tier.STARTER, Tier.PRO, Tier.TEAM, Tier.UNLIMITED]
VALUES = [t.value for t in ORDER]
# What Stripe and MCPize may set; Unlimited is the operator's to give.
BILLABLE = [t.value for t in ORDER if t != Tier.UNLIMITED]


def rank(tier: str) -> int:
    return VALUES.index(tier)


def is_billable(tier: str) -> bool:
    return tier in BILLABLE


def memory_limit(tier: str) -> int | None:
    """Return how many memories a tier may hold, or None for no limit (every tier but Free)."""
    return settings.FREE_TIER_MAX_MEMORIES if tier == Tier.FREE else None

"""Billing tiers, from the least to the most capable."""

from __future__ import annotations

from django.db import models


class Tier(models.TextChoices):
    FREE = "free", "Free"
    STARTER = "starter", "Starter"
    PRO = "pro", "Pro"
    TEAM = "team", "Team"


ORDER = [Tier.FREE, Tier.STARTER, Tier.PRO, Tier.TEAM]
VALUES = [t.value for t in ORDER]


def rank(tier: str) -> int:
    return VALUES.index(tier)


def is_paid(tier: str) -> bool:
    return tier != Tier.FREE

"""Users, API keys and tiers: the operations every interface shares.

Functions that act for a signed-in user or a key holder take ``user_id`` and
run on the tenant path; operator functions (admin, webhooks, CLI) say so in
their names or docstrings and run on the operator path. Anything that changes
what a key may do ends with ``auth.invalidate()`` so the change takes effect
on the MCP endpoint at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, connection, models, transaction
from django.db.models import QuerySet, Value
from django.db.models.functions import Lower
from django.utils import timezone

from accounts import holdings, keycache, keys, tiers
from accounts.models import Agent, ApiKey, User
from core import storable, tenancy
from core.errors import NotFound, QuotaExceeded, ValidationFailed


def check_tier(tier: object) -> str:
    if tier not in tiers.VALUES:
        raise ValidationFailed("tier must be one of " + ", ".join(tiers.VALUES) + ".")
    return str(tier)


def create_user(*, email: str, password: str | None = None, tier: str = "free", **extra) -> User:
    """Create a user (operator path: users are not tenant rows)."""
    check_tier(tier)
    email = User.objects.normalize_email(email)
    if not email or "@" not in email:
        raise ValidationFailed("email must be an email address.")
    if User.objects.filter(email=email).exists():
        raise ValidationFailed(f"A user with email {email} already exists.")
    return User.objects.create_user(email, password, tier=tier, **extra)


def key_name(name: object) -> str:
    """Return a key's name as stored (trimmed), or raise if it cannot be one."""
    if not isinstance(name, str):
        raise ValidationFailed("name must be a string.")
    limit = storable.column_length(ApiKey, "name")
    storable.text(name, field="name", max_length=limit)
    # As an agent's: an escape sequence reached the operator's terminal through
    # list-keys, and a direction override turned the name around on the page.
    storable.name(name, field="name")
    return name.strip()


def issue_key(
    *, user: User, name: str = "", tier: str | None = None, agent: str | None = None
) -> tuple[ApiKey, str]:
    """Issue a key for ``user`` (operator path). Returns the key and its secret, shown once.

    ``agent`` names one of the user's agents for the key to act as; unset,
    the key is user-wide.
    """
    asked = check_tier(tier) if tier else None
    name = key_name(name)
    with transaction.atomic():
        _lock_keys(user.id)
        # The user's tier as it is now, under the lock: ``user`` may have been read
        # before a tier change committed.
        tier = asked or User.objects.values_list("tier", flat=True).get(id=user.id)
        with tenancy.operator():
            scoped = None
            if agent is not None:
                scoped = _named(Agent.objects.filter(user=user), agent.strip()).first()
                if scoped is None:
                    raise ValidationFailed(
                        f"{user.email} has no agent called {agent!r}. Agents are made on the"
                        " dashboard's Agents page, or by approving an OAuth connection."
                    )
            return ApiKey.objects.issue(user=user, name=name, tier=tier, agent=scoped)


def revoke_keys(key_ids: Iterable[uuid.UUID | str]) -> int:
    """Revoke keys by id (operator path). Returns how many were live."""
    with tenancy.operator():
        revoked = ApiKey.objects.filter(id__in=list(key_ids), revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
    invalidate_cached_auth()
    return revoked


class CallerGone(Exception):
    """The key a request came with was revoked, or its user deactivated, after the request
    was authenticated from the cache (another server's change reaches this one's cache only
    when its entry runs out)."""


def _issuer_tier(user_id: uuid.UUID | str, by_key: uuid.UUID | str | None) -> str | None:
    """The current tier of the key ``by_key``, read now in the caller's transaction, or None
    without one (the dashboard: a signed-in user). Raises CallerGone if it is revoked."""
    if by_key is None:
        return None
    tier = (
        ApiKey.objects.filter(id=by_key, user_id=user_id, revoked_at__isnull=True)
        .values_list("tier", flat=True)
        .first()
    )
    if tier is None:
        raise CallerGone
    return tier


def _check_active(user_id: uuid.UUID | str, by_key: uuid.UUID | str | None) -> None:
    """Raise CallerGone if a key's request comes for a user deactivated since (users are
    read outside the tenant path)."""
    if by_key is not None and not User.objects.filter(id=user_id, is_active=True).exists():
        raise CallerGone


def revoke_own_key(
    *,
    user_id: uuid.UUID | str,
    key_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    by_key: uuid.UUID | str | None = None,
) -> None:
    """Revoke one of the caller's own keys (tenant path): another user's key is not found.

    An agent's key sees, and so revokes, only that agent's keys. ``by_key``: the key the
    request came with, which must still be live.
    """
    try:
        key_uuid = uuid.UUID(str(key_id))
    except ValueError:
        raise NotFound("No such API key.") from None
    _check_active(user_id, by_key)
    with tenancy.tenant(user_id, agent_id=agent_id):
        _issuer_tier(user_id, by_key)
        key = ApiKey.objects.filter(id=key_uuid).first()
        if key is None:
            raise NotFound("No such API key.")
        if key.revoked_at is None:
            ApiKey.objects.filter(id=key_uuid).update(revoked_at=timezone.now())
    invalidate_cached_auth()


def set_key_tier(key_ids: Iterable[uuid.UUID | str], tier: str) -> int:
    """Change keys' tier (operator path)."""
    tier = check_tier(tier)
    with tenancy.operator():
        changed = ApiKey.objects.filter(id__in=list(key_ids)).update(tier=tier)
    invalidate_cached_auth()
    return changed


def set_user_tier(*, user_id: uuid.UUID | str, tier: str) -> None:
    """Set a user's tier and every one of their keys' (operator path: billing and admin)."""
    tier = check_tier(tier)
    with transaction.atomic():
        # A key being issued now holds this lock from before it reads a tier until it
        # commits: waiting for it, the update below reaches that key too; otherwise the
        # issue waits, and reads the new tier.
        _lock_keys(user_id)
        User.objects.filter(id=user_id).update(tier=tier)
        with tenancy.operator():
            ApiKey.objects.filter(user_id=user_id).update(tier=tier)
    invalidate_cached_auth()


def _lock_keys(user_id: uuid.UUID | str) -> None:
    """Take the lock that serialises issuing a user's keys with changing their tier, until
    the transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", [f"keys:{user_id}"])


def invalidate_cached_auth() -> None:
    # Now, and again once the surrounding transaction (an admin request, a
    # webhook) commits: a request that authenticates in between still reads
    # the old row and would cache it until the TTL runs out. Other processes
    # hear of it once, at the commit (PostgreSQL delivers the NOTIFY then).
    keycache.invalidate()
    transaction.on_commit(lambda: keycache.invalidate(announce=False))


# Self-service: a user's own keys, on the tenant path ---------------------------


def issue_own_key(
    *,
    user_id: uuid.UUID | str,
    max_tier: str,
    name: str = "",
    tier: str | None = None,
    agent_id: uuid.UUID | str | None = None,
    by_key: uuid.UUID | str | None = None,
) -> tuple[ApiKey, str]:
    """Issue a key for the caller, at most ``max_tier``. Returns the key and its secret, shown once.

    ``max_tier`` is the tier of the key making the request, or the user's own
    tier from the dashboard: no one can mint a key that does more than they can.
    Both were read before this call, and are read again here, under the lock
    ``set_user_tier`` takes: a key revoked, or a tier lowered, since must not
    mint a live key at the old tier.
    """
    asked = check_tier(tier) if tier else None
    name = key_name(name)
    limit = settings.MAX_KEYS_PER_USER
    with transaction.atomic():
        # Before any tier is read: a tier change committed while this request
        # read one and inserted its key would miss the key (the key would
        # keep the old tier for good). Also serialises this user's issuing, so
        # two concurrent requests at the cap cannot both pass the count.
        _lock_keys(user_id)
        user = User.objects.get(id=user_id)
        if by_key is not None and not user.is_active:
            raise CallerGone
        with tenancy.tenant(user_id):
            current = _issuer_tier(user_id, by_key) if by_key is not None else user.tier
            if current is not None and tiers.rank(current) < tiers.rank(max_tier):
                max_tier = current
            tier = asked or max_tier
            if tiers.rank(tier) > tiers.rank(max_tier):
                whose = "the tier of this key" if by_key is not None else "your tier"
                raise ValidationFailed(f"tier must not be above {max_tier}, {whose}.")
            agent = _own_agent(user_id, agent_id) if agent_id else None
            if ApiKey.objects.filter(user_id=user_id, revoked_at__isnull=True).count() >= limit:
                raise QuotaExceeded(
                    f"You already have {limit} live API keys, the most allowed. "
                    "Revoke one you no longer use, then try again."
                )
            return ApiKey.objects.issue(user=user, name=name, tier=tier, agent=agent)


def list_own_keys(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None, limit: int = 100
) -> list[ApiKey]:
    """Return the caller's keys, live ones first, then newest first (tenant path).

    An agent's key sees only that agent's keys.
    """
    with tenancy.tenant(user_id, agent_id=agent_id):
        return list(
            ApiKey.objects.filter(user_id=user_id)
            .select_related("agent")
            .defer("key_hash")
            .order_by(models.F("revoked_at").desc(nulls_first=True), "-created_at")[:limit]
        )


# Tier limits -----------------------------------------------------------------------


@dataclass(frozen=True)
class RateLimit:
    tier: str
    label: str
    calls: int | None  # None: no limit
    period_s: int | None

    @property
    def rate(self) -> str:
        """Say the rate as people do: "10 per minute", or "no limit"."""
        if self.calls is None or self.period_s is None:
            return "no limit"
        unit = {1: "second", 60: "minute", 3600: "hour"}.get(self.period_s, f"{self.period_s} s")
        return f"{self.calls} per {unit}"


def rate_limit(tier: str) -> RateLimit:
    """Return one tier's rate limit."""
    calls, period_s = settings.RATE_LIMITS[tier] or (None, None)
    return RateLimit(tier, tiers.Tier(tier).label, calls, period_s)


def rate_limits() -> list[RateLimit]:
    """Return every tier's rate limit, from the least capable tier to the most."""
    return [rate_limit(tier.value) for tier in tiers.ORDER]


# Lookups for the CLI and the auth cache, on the operator path --------------------


def get_user(*, user_id: uuid.UUID | str) -> User | None:
    """Return the user with this id, or None."""
    return User.objects.filter(id=user_id).first()


def has_users() -> bool:
    """Say whether any user exists yet (the first run creates one)."""
    return User.objects.exists()


def normalize_email(email: str | None) -> str:
    """Return an address as users are stored under it (the domain in lower case)."""
    return User.objects.normalize_email(email)


def find_user(*, email: str) -> User | None:
    """Return the user with this email address, however it is capitalised."""
    return User.objects.filter(email=User.objects.normalize_email(email)).first()


def find_live_key(*, raw: str) -> ApiKey | None:
    """Return the live key whose secret is ``raw``, or None (operator path)."""
    return ApiKey.objects.for_key(raw)


def find_keys(*, id_or_prefix: str) -> list[ApiKey]:
    """Return the keys with this id, this display prefix, or this whole key (operator path).

    A whole key is found as authentication finds it, by its display prefix and
    then its HMAC under the current secret or a fallback; revoked keys and keys
    of deactivated users too, so that revoking one twice says it is revoked.
    """
    with tenancy.operator():
        if keys.is_well_formed(id_or_prefix):
            candidates = ApiKey.objects.filter(prefix=keys.display_prefix(id_or_prefix))
            return [
                key
                for key in candidates
                if keys.matching_secret(id_or_prefix, key.key_hash) is not None
            ]
        try:
            return list(ApiKey.objects.filter(id=uuid.UUID(id_or_prefix)))
        except ValueError:
            return list(ApiKey.objects.filter(prefix=id_or_prefix))


def list_keys(*, email: str | None = None, include_revoked: bool = False) -> list[ApiKey]:
    """Return keys with their users, by user email then age, never secrets (operator path)."""
    with tenancy.operator():
        found = ApiKey.objects.select_related("user").order_by("user__email", "created_at")
        if email:
            found = found.filter(user__email=User.objects.normalize_email(email))
        if not include_revoked:
            found = found.filter(revoked_at__isnull=True)
        return list(found)


def record_key_use(last_used: Mapping[uuid.UUID, datetime]) -> None:
    """Move keys' ``last_used_at`` forward to these times, never back (operator path)."""
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.executemany(
            "UPDATE api_keys SET last_used_at = GREATEST(last_used_at, %s) WHERE id = %s",
            [(when, key_id) for key_id, when in last_used.items()],
        )


# Agents: the user's own, on the tenant path ----------------------------------

AGENT_NAME_MAX = 64


def _agent_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValidationFailed("An agent needs a name, such as 'research' or 'claude-desktop'.")
    storable.text(name, field="An agent's name")
    storable.name(name, field="An agent's name")
    name = " ".join(name.split())
    if len(name) > AGENT_NAME_MAX:
        raise ValidationFailed(f"An agent's name is at most {AGENT_NAME_MAX} characters.")
    return name


def _own_agent(user_id: uuid.UUID | str, agent_id: uuid.UUID | str) -> Agent:
    """Return one of the user's agents (inside their tenant transaction), or raise NotFound."""
    try:
        agent_uuid = uuid.UUID(str(agent_id))
    except ValueError:
        raise NotFound("No such agent.") from None
    agent = Agent.objects.filter(id=agent_uuid, user_id=user_id).first()
    if agent is None:
        raise NotFound("No such agent.")
    return agent


def _named(agents: QuerySet[Agent], name: str) -> QuerySet[Agent]:
    """The agents called ``name`` in any case, folded as the unique index folds it.

    ``iexact`` compares UPPER(), which the index's lower() does not always
    agree with (the Kelvin sign, final sigma): a name the index refused could
    then be found by no lookup.
    """
    return agents.annotate(folded=Lower("name")).filter(folded=Lower(Value(name)))


def create_agent(*, user_id: uuid.UUID | str, name: object) -> Agent:
    """Create an agent for the user. Names are unique per user."""
    clean = _agent_name(name)
    taken = ValidationFailed(f"You already have an agent called {clean!r}.")
    try:
        with tenancy.tenant(user_id):
            if _named(Agent.objects.filter(user_id=user_id), clean).exists():
                raise taken
            return Agent.objects.create(user_id=user_id, name=clean)
    except IntegrityError:
        # The same name created at the same moment (a double click): the
        # constraint decided, and this one lost.
        raise taken from None


def agent_called(*, user_id: uuid.UUID | str, name: object) -> tuple[Agent, bool]:
    """Return the user's agent of this name (any case), made if there is none, and if it is new.

    Two callers making the same agent at once (two connections of one
    client, two imports) both get the one that was made.
    """
    clean = _agent_name(name)
    for _ in range(2):
        with tenancy.tenant(user_id):
            found = _named(Agent.objects.filter(user_id=user_id), clean).first()
        if found is not None:
            return found, False
        try:
            return create_agent(user_id=user_id, name=clean), True
        except ValidationFailed:
            continue  # made meanwhile: the next look finds it
    raise ValidationFailed(f"The agent {clean!r} could not be made; try again.")


def list_agents(*, user_id: uuid.UUID | str) -> list[Agent]:
    """Return the user's agents, by name, each with ``memory_count`` and ``key_count``."""
    with tenancy.tenant(user_id):
        return list(
            Agent.objects.filter(user_id=user_id)
            .annotate(
                memory_count=models.Count("memories", distinct=True),
                key_count=models.Count(
                    "api_keys",
                    filter=models.Q(api_keys__revoked_at__isnull=True),
                    distinct=True,
                ),
            )
            .order_by("name")
        )


def get_agent(*, user_id: uuid.UUID | str, agent_id: uuid.UUID | str) -> Agent:
    with tenancy.tenant(user_id):
        return _own_agent(user_id, agent_id)


def rename_agent(*, user_id: uuid.UUID | str, agent_id: uuid.UUID | str, name: object) -> Agent:
    clean = _agent_name(name)
    with tenancy.tenant(user_id):
        agent = _own_agent(user_id, agent_id)
        clash = _named(Agent.objects.filter(user_id=user_id), clean).exclude(id=agent.id)
        if clash.exists():
            raise ValidationFailed(f"You already have an agent called {clean!r}.")
        Agent.objects.filter(id=agent.id).update(name=clean)
        agent.name = clean
        return agent


def delete_agent(*, user_id: uuid.UUID | str, agent_id: uuid.UUID | str) -> None:
    """Delete an agent with its memories and scoped keys; its OAuth connections end too.

    The database removes the memories and keys (ON DELETE CASCADE on the
    composite keys) and keeps its usage events with no agent. The apps that
    own those rows lock them first, as their writers take them
    (``holdings.agent_deleting``): the cascade meets them in its scan's order.
    """
    with tenancy.tenant(user_id):
        agent = _own_agent(user_id, agent_id)
        holdings.agent_deleting(user_id=user_id, agent_id=agent.id)
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM agents WHERE id = %s", [agent.id])
    invalidate_cached_auth()

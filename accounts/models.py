from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, BaseUserManager, PermissionsMixin
from django.db import models
from django.db.models.functions import Lower, Now
from django.utils import timezone

from accounts import keys
from accounts.tiers import VALUES as TIER_VALUES
from accounts.tiers import Tier
from core import tenancy


class UserManager(BaseUserManager["User"]):
    use_in_migrations = True

    @classmethod
    def normalize_email(cls, email: str | None) -> str:
        """Return ``email`` as it is stored and looked up: trimmed, all lower case.

        Django lower-cases only the domain. Recall treats the whole address as
        case-insensitive, so one person cannot sign up twice as Alice@ and alice@.
        """
        return super().normalize_email((email or "").strip()).lower()

    def create_user(self, email: str, password: str | None = None, **fields: object) -> User:
        if not email:
            raise ValueError("Users need an email address.")
        user = self.model(email=self.normalize_email(email), **fields)
        user.set_password(password)  # None leaves an unusable password
        user.save(using=self._db)
        return user

    def create_superuser(self, email: str, password: str | None = None, **fields: object) -> User:
        fields.setdefault("is_staff", True)
        fields.setdefault("is_superuser", True)
        return self.create_user(email, password, **fields)

    def get_by_natural_key(self, username: str | None) -> User:
        return self.get(email__iexact=username)


class User(AbstractBaseUser, PermissionsMixin):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Stored normalised (see save), so the unique index is case-insensitive in effect.
    email = models.EmailField(max_length=254, unique=True)
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.FREE)
    is_active = models.BooleanField(default=True)
    is_staff = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"

    class Meta:
        db_table = "users"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(tier__in=TIER_VALUES), name="users_tier_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.email

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.email = User.objects.normalize_email(self.email)
        super().save(*args, **kwargs)


class Agent(models.Model):
    """One of a user's agents: the unit that OAuth connections and scoped keys act as.

    Memories written as an agent are that agent's alone (row-level security,
    see core/tenancy.py); memories written with a user-wide API key belong
    to the user as a whole.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=64)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "agents"
        constraints = [
            # Names are compared ignoring case wherever they are looked up.
            models.UniqueConstraint("user", Lower("name"), name="agents_user_name_unique"),
            # The target of the composite foreign keys (agent_id, user_id) on
            # memories and api_keys: an agent can only ever hold its own user's rows.
            models.UniqueConstraint(fields=["id", "user"], name="agents_id_user_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class ApiKeyManager(models.Manager["ApiKey"]):
    def issue(
        self,
        *,
        user: User,
        name: str = "",
        tier: str | None = None,
        agent: Agent | None = None,
    ) -> tuple[ApiKey, str]:
        """Create a key for ``user`` and return it with the raw secret, the only time it exists."""
        raw = keys.generate()
        key = self.create(
            user=user,
            agent=agent,
            name=name,
            tier=tier or user.tier,
            prefix=keys.display_prefix(raw),
            key_hash=keys.digest(raw),
        )
        return key, raw

    def for_key(self, raw: str) -> ApiKey | None:
        """Return the live key matching ``raw``, or None.

        Runs on the operator path: nobody is known until the key is. Rows are
        found by display prefix and checked by HMAC in constant time; a key
        hashed under a fallback secret is re-hashed under the current one.
        """
        if not keys.is_well_formed(raw):
            return None
        with tenancy.operator():
            candidates = list(
                self.select_related("user", "agent").filter(
                    prefix=keys.display_prefix(raw), revoked_at__isnull=True
                )
            )
            for key in candidates:
                secret = keys.matching_secret(raw, key.key_hash)
                if secret is None:
                    continue
                if not key.user.is_active:
                    return None
                if secret != keys.current_secret():
                    key.key_hash = keys.digest(raw)
                    key.save(update_fields=["key_hash"])
                return key
        return None


class ApiKey(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_keys")
    # Set: the key acts as this agent and sees only its memory. Unset: user-wide.
    # The database deletes the key with its agent (ON DELETE CASCADE on a
    # composite key, see migration 0004); the tenant role may not delete keys.
    agent = models.ForeignKey(
        Agent,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="api_keys",
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=keys.DISPLAY_LENGTH)
    key_hash = models.CharField(max_length=64)
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.FREE)
    created_at = models.DateTimeField(db_default=Now())
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyManager()

    class Meta:
        db_table = "api_keys"
        verbose_name = "API key"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(tier__in=TIER_VALUES), name="api_keys_tier_valid"
            ),
            models.UniqueConstraint(fields=["key_hash"], name="api_keys_key_hash_unique"),
        ]
        indexes = [
            # Used by ApiKey.objects.for_key on every uncached request.
            models.Index(fields=["prefix"], name="api_keys_prefix_idx"),
            # Used by the key lists in the dashboard and the self-service API.
            models.Index(fields=["user", "created_at"], name="api_keys_user_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

"""The operators' admin for users and API keys.

Every request here runs on the operator path (recall/middleware.py). Tier
changes and revocations go through accounts/services.py, which invalidates
the auth cache, so they take effect on the MCP endpoint at once.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import admin as auth_admin
from django.contrib.auth import forms as auth_forms
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse

from accounts import holdings, services, tiers
from accounts.models import ApiKey, User
from core import once
from core.admin_tools import EstimatedCountPaginator, InputFilter, count_per_user

logger = logging.getLogger(__name__)

admin.site.site_header = "Recall operations"
admin.site.site_title = "Recall operations"
admin.site.index_title = "Users, keys, memories and usage"


class UserEmailFilter(InputFilter):
    title = "user email"
    parameter_name = "user_email"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = User.objects.normalize_email(self.value())
        if not value:
            return queryset
        # Look the id up first: "user_id = <constant>" lets the planner use the
        # (user, ...) indexes, where a join on email leaves it guessing.
        user_id = User.objects.filter(email=value).values_list("id", flat=True).first()
        return queryset.filter(user_id=user_id) if user_id else queryset.none()


class UserCreationForm(auth_forms.AdminUserCreationForm):
    class Meta:
        model = User
        fields = ("email", "tier")

    def clean_email(self) -> str:
        email = User.objects.normalize_email(self.cleaned_data.get("email"))
        if User.objects.filter(email=email).exists():
            raise forms.ValidationError("A user with this email already exists.")
        return email


class UserChangeForm(auth_forms.UserChangeForm):
    class Meta:
        model = User
        fields = "__all__"

    def clean_email(self) -> str:
        email = User.objects.normalize_email(self.cleaned_data.get("email"))
        if User.objects.filter(email=email).exclude(pk=self.instance.pk).exists():
            raise forms.ValidationError("A user with this email already exists.")
        return email


def _user_tier_action(tier: tiers.Tier) -> Any:
    def action(modeladmin: UserAdmin, request: HttpRequest, queryset: QuerySet[User]) -> None:
        ids = list(queryset.values_list("id", flat=True))
        for user_id in ids:
            services.set_user_tier(user_id=user_id, tier=tier.value)
        modeladmin.message_user(request, f"{len(ids)} user(s) and their keys are now {tier.label}.")

    action.__name__ = f"set_users_tier_{tier.value}"
    return admin.action(description=f"Set tier to {tier.label} (user and all keys)")(action)


@admin.register(User)
class UserAdmin(auth_admin.UserAdmin):
    form = UserChangeForm
    add_form = UserCreationForm
    list_display = ("email", "tier", "memory_count", "key_count", "created_at", "is_staff")
    list_filter = ("tier", "is_staff", "is_active")
    search_fields = ("email",)
    ordering = ("-created_at",)
    readonly_fields = ("created_at", "last_login")
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    fieldsets = (
        (None, {"fields": ("email", "password")}),
        ("Plan", {"fields": ("tier",)}),
        (
            "Permissions",
            {"fields": ("is_active", "is_staff", "is_superuser", "groups", "user_permissions")},
        ),
        ("Dates", {"fields": ("created_at", "last_login")}),
    )
    add_fieldsets = (
        (
            None,
            {
                "classes": ("wide",),
                "fields": ("email", "tier", "usable_password", "password1", "password2"),
            },
        ),
    )
    actions = [_user_tier_action(tier) for tier in tiers.ORDER]

    def get_queryset(self, request: HttpRequest) -> QuerySet[User]:
        return (
            super()
            .get_queryset(request)
            .annotate(
                memory_total=holdings.per_user("memories"),
                live_keys=count_per_user(ApiKey.objects.filter(revoked_at__isnull=True)),
            )
        )

    # Not sortable: ordering by a count would compute it for every user.
    @admin.display(description="memories")
    def memory_count(self, obj: Any) -> int:
        return obj.memory_total

    @admin.display(description="live keys")
    def key_count(self, obj: Any) -> int:
        return obj.live_keys

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """Summarise what deleting users takes with it, by counting.

        Django would load and list every related row, and a user can have
        millions of usage events. Their keys, memories, usage and billing rows
        go with them by design, so the read-only admins of those models do not
        stand in the way either.
        """
        users = list(objs)
        ids = [user.pk for user in users]
        counts = {
            "API keys": ApiKey.objects.filter(user_id__in=ids).count(),
            **holdings.count(ids),
        }
        listed: list[Any] = [str(user) for user in users]
        listed.append([f"{count} {name}" for name, count in counts.items() if count])
        model_count = {"users": len(users), **{k: v for k, v in counts.items() if v}}
        perms_needed = set() if self.has_delete_permission(request) else {"user"}
        return listed, model_count, perms_needed, []

    def delete_model(self, request: HttpRequest, obj: User) -> None:
        """Delete a user, after the apps above accounts have taken their rows in their own order.

        Django's collector meets a user's memories in the order its scan finds
        them; a live write of two of them takes them in id order.
        """
        with transaction.atomic():
            holdings.users_deleting([obj.pk])
            super().delete_model(request, obj)
            # Their keys went with them: no process may go on taking them.
            services.invalidate_cached_auth()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        # The bulk action, as ``delete_model``.
        with transaction.atomic():
            holdings.users_deleting(queryset.values_list("pk", flat=True))
            super().delete_queryset(request, queryset)
            services.invalidate_cached_auth()

    def save_model(self, request: HttpRequest, obj: User, form: Any, change: bool) -> None:
        if change and "tier" in form.changed_data:
            # The user's keys follow, and the auth cache forgets the old tier. Before
            # the save: it waits for a key being issued, and the save (of a new email)
            # would lock the row that key's insert needs.
            services.set_user_tier(user_id=obj.pk, tier=obj.tier)
        super().save_model(request, obj, form, change)
        if change and "tier" not in form.changed_data and "is_active" in form.changed_data:
            # A deactivated user's keys stop at once, not when their cache entry runs out.
            services.invalidate_cached_auth()


class KeyStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "Live"), ("revoked", "Revoked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> QuerySet[ApiKey]:
        if self.value() == "live":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


class ApiKeyAddForm(forms.ModelForm):
    # A fresh token on every add page: the same form sent again (a reload of
    # the page that showed the new key) names a spent one and makes no key.
    once = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    class Meta:
        model = ApiKey
        fields = ("user", "name", "tier")


def _key_tier_action(tier: tiers.Tier) -> Any:
    def action(modeladmin: ApiKeyAdmin, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        changed = services.set_key_tier(list(queryset.values_list("id", flat=True)), tier.value)
        modeladmin.message_user(request, f"{changed} key(s) are now {tier.label}.")

    action.__name__ = f"set_keys_tier_{tier.value}"
    return admin.action(description=f"Set tier to {tier.label}")(action)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = (
        "prefix",
        "name",
        "user",
        "tier",
        "is_live",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("tier", KeyStatusFilter)
    search_fields = ("user__email", "prefix", "name")
    list_select_related = ("user",)
    autocomplete_fields = ("user",)
    ordering = ("-created_at",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    actions = ["revoke", *(_key_tier_action(tier) for tier in tiers.ORDER)]

    @admin.display(boolean=True, description="live")
    def is_live(self, obj: ApiKey) -> bool:
        return obj.revoked_at is None

    def get_form(
        self, request: HttpRequest, obj: ApiKey | None = None, change: bool = False, **kwargs: Any
    ) -> type[forms.ModelForm[ApiKey]]:
        if obj is None:
            kwargs["form"] = ApiKeyAddForm
        return super().get_form(request, obj, change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        if obj is None:
            return ("user", "name", "tier", "once")
        # The hash is never shown; the secret was never stored.
        return ("user", "name", "prefix", "tier", "created_at", "last_used_at", "revoked_at")

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        if obj is None:
            return ()
        return ("user", "prefix", "created_at", "last_used_at", "revoked_at")

    def get_actions(self, request: HttpRequest) -> Any:
        # Revoke, don't delete: a revoked key keeps its usage attributable.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, str | list[str]]:
        return {**super().get_changeform_initial_data(request), "once": secrets.token_urlsafe(16)}

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        sent = request.POST.get("once", "") if request.method == "POST" else ""
        if once.sent_before(request, sent):
            self.message_user(
                request,
                "That form was sent before, and its key is listed below. Its secret was shown"
                " once: if you did not copy it, revoke the key and add another.",
                messages.WARNING,
            )
            return redirect("admin:accounts_apikey_changelist")
        try:
            response = super().add_view(request, form_url, extra_context)
        except Exception:
            once.unspend(request, sent)
            raise
        if not hasattr(request, "_recall_issued_key"):
            once.unspend(request, sent)  # no key came of it: the corrected form may make one
        return response

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            obj.save(update_fields=["name"])
            if "tier" in form.changed_data:
                services.set_key_tier([obj.pk], obj.tier)
            return
        key, raw = services.issue_key(user=obj.user, name=obj.name, tier=obj.tier)
        # The admin logs and links to the object it was given: make it the issued key.
        obj.pk, obj.prefix, obj.key_hash, obj.created_at = (
            key.pk,
            key.prefix,
            key.key_hash,
            key.created_at,
        )
        obj._state.adding = False
        obj._state.db = key._state.db
        # Shown on the page that answers this request (response_add), never
        # in a message: the default message storage is a cookie, readable by
        # anyone holding the response, and the session is stored too.
        request._recall_issued_key = raw  # type: ignore[attr-defined]
        logger.info(
            "api key issued by operator",
            extra={"key_id": str(key.pk), "user_id": str(key.user_id), "operator": request.user.pk},
        )

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        raw = getattr(request, "_recall_issued_key", None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        context = {**self.admin_site.each_context(request), "key": obj, "raw": raw}
        response = TemplateResponse(request, "admin/accounts/apikey/issued.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def delete_model(self, request: HttpRequest, obj: ApiKey) -> None:
        super().delete_model(request, obj)
        # A deleted key stops at once, as a revoked one does.
        services.invalidate_cached_auth()

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = services.revoke_keys(list(queryset.values_list("id", flat=True)))
        self.message_user(request, f"Revoked {revoked} key(s).")

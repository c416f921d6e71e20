"""Usage events and billing state in the admin, read-only.

Usage events are the biggest table there is. The list never counts all of it
(``EstimatedCountPaginator``), shows no facet counts, filters only on
indexed columns (see the indexes on ``UsageEvent``), and the CSV export
streams the current filter's rows in keyset-paginated chunks, each read in a
short operator transaction of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR
from django.core.exceptions import PermissionDenied
from django.core.handlers.asgi import ASGIRequest
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import path, reverse
from django.utils import timezone

from accounts.admin import UserEmailFilter
from billing.models import (
    BillingAccount,
    Subscription,
    UsageEvent,
    WebhookEvent,
    WebhookRejection,
)
from core import errors, tenancy, usage
from core.admin_tools import EstimatedCountPaginator, csv_line

TOOLS = ("remember", "recall", "list_memories", "update_memory", "forget")
EXPORT_CHUNK = 2000
EXPORT_COLUMNS = (
    "id",
    "occurred_at",
    "user__email",
    "api_key__prefix",
    "request_id",
    "tool_name",
    "success",
    "error_code",
    "latency_ms",
    "tokens_consumed",
)


class ToolFilter(admin.SimpleListFilter):
    title = "tool"
    parameter_name = "tool"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # A fixed list: finding the distinct names would scan the table.
        return [(tool, tool) for tool in TOOLS]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(tool_name=self.value()) if self.value() else queryset


class ErrorCodeFilter(admin.SimpleListFilter):
    title = "error code"
    parameter_name = "error"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        codes = sorted({*errors.CODES, errors.RateLimited.code, usage.CANCELLED})
        return [(code, code) for code in codes]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(error_code=self.value()) if self.value() else queryset


def export_rows(queryset: QuerySet[UsageEvent]) -> Iterator[str]:
    """Yield the CSV, newest first, ``EXPORT_CHUNK`` rows per operator transaction.

    Keyset pagination on id: every chunk is an index range scan, and no
    transaction or cursor stays open while the client reads.
    """
    yield csv_line(EXPORT_COLUMNS)
    rows = queryset.order_by("-id").values_list(*EXPORT_COLUMNS)
    last_id: int | None = None
    while True:
        page = rows if last_id is None else rows.filter(id__lt=last_id)
        with tenancy.operator():
            chunk = list(page[:EXPORT_CHUNK])
        if not chunk:
            return
        yield "".join(csv_line(row) for row in chunk)
        last_id = chunk[-1][0]


async def _async_rows(rows: Iterator[str]) -> AsyncIterator[str]:
    # Under ASGI, Django would read a synchronous iterator to the end before
    # sending a byte. Pull one chunk at a time in the request's thread instead.
    while True:
        chunk = await sync_to_async(lambda: next(rows, None), thread_sensitive=True)()
        if chunk is None:
            return
        yield chunk


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(UsageEvent)
class UsageEventAdmin(ReadOnlyAdmin):
    list_display = (
        "occurred_at",
        "user",
        "tool_name",
        "success",
        "error_code",
        "latency_ms",
        "api_key",
        "request_id",
    )
    list_filter = (UserEmailFilter, ToolFilter, "success", ErrorCodeFilter, "occurred_at")
    # Exact match only: the index on request_id serves it.
    search_fields = ("request_id__exact",)
    search_help_text = "Find an event by its request id (from a log line or X-Request-ID)."
    list_select_related = ("user", "api_key")
    ordering = ("-occurred_at", "-id")
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    change_list_template = "admin/billing/usageevent/change_list.html"

    def get_urls(self) -> list[Any]:
        export = path(
            "export/",
            self.admin_site.admin_view(self.export_view),
            name="billing_usageevent_export",
        )
        return [export, *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        params = request.GET.copy()
        params.pop(PAGE_VAR, None)  # the export has every page
        query = params.urlencode()
        export_url = reverse("admin:billing_usageevent_export") + (f"?{query}" if query else "")
        return super().changelist_view(request, {**(extra_context or {}), "export_url": export_url})

    def export_view(self, request: HttpRequest) -> StreamingHttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        params = request.GET.copy()
        params.pop(PAGE_VAR, None)
        # Django lets a view swap request.GET for another QueryDict; the stub
        # types the attribute as the immutable kind the request starts with.
        request.GET = params  # type: ignore[assignment]
        # The same filters, search and date range as the list the operator sees.
        queryset = self.get_changelist_instance(request).queryset
        rows = export_rows(queryset)
        content = _async_rows(rows) if isinstance(request, ASGIRequest) else rows
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        return StreamingHttpResponse(
            content,
            content_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="usage-{stamp}.csv"'},
        )


@admin.register(BillingAccount)
class BillingAccountAdmin(ReadOnlyAdmin):
    list_display = ("user", "stripe_customer_id", "mcpize_event_created", "updated_at")
    search_fields = ("user__email", "stripe_customer_id__exact")
    list_select_related = ("user",)


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    list_display = ("id", "user", "status", "price_id", "event_created", "updated_at")
    list_filter = ("status",)
    search_fields = ("user__email", "id__exact", "customer_id__exact")
    list_select_related = ("user",)


@admin.register(WebhookEvent)
class WebhookEventAdmin(ReadOnlyAdmin):
    list_display = ("received_at", "source", "event_type", "event_id")
    list_filter = ("source",)
    search_fields = ("event_id__exact",)
    ordering = ("-received_at",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False


@admin.register(WebhookRejection)
class WebhookRejectionAdmin(ReadOnlyAdmin):
    """Signed deliveries refused for their content: what to ask the sender about."""

    list_display = ("received_at", "source", "status", "reason", "event_type", "event_id")
    list_filter = ("source", "status")
    search_fields = ("event_id__exact",)
    ordering = ("-received_at",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False

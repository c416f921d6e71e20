"""Memories in the admin: read-only, embedding hidden, content truncated.

Operators can find a user's memories and delete one, but not read them in
full or change them. A deletion is audited twice: Django's admin log records
it (by namespace and id, see ``Memory.__str__``), and a log line names the
memory, its owner and the operator, never the content.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Left
from django.http import HttpRequest

from accounts.admin import UserEmailFilter
from core.admin_tools import EstimatedCountPaginator, InputFilter
from memories import services
from memories.models import Memory

logger = logging.getLogger(__name__)

PREVIEW_CHARS = 120


class NamespaceFilter(InputFilter):
    title = "namespace"
    parameter_name = "ns"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = (self.value() or "").strip()
        return queryset.filter(namespace=value) if value else queryset


@admin.register(Memory)
class MemoryAdmin(admin.ModelAdmin):
    list_display = ("id", "user", "namespace", "preview", "created_at", "updated_at")
    list_filter = (UserEmailFilter, NamespaceFilter)
    list_select_related = ("user",)
    fields = ("id", "user", "namespace", "preview", "metadata", "embedding_model", "created_at")
    readonly_fields = fields
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    def get_queryset(self, request: HttpRequest) -> QuerySet[Memory]:
        # Neither the vector nor the full text leaves the database.
        return (
            super()
            .get_queryset(request)
            .defer("embedding", "content")
            .annotate(content_start=Left("content", PREVIEW_CHARS + 1))
        )

    def get_ordering(self, request: HttpRequest) -> list[str]:
        # Newest first within a user is an index scan; across every user it
        # would sort the whole table, so the unfiltered list goes by id.
        if request.GET.get(UserEmailFilter.parameter_name) or request.GET.get("user"):
            return ["-created_at", "-id"]
        return ["-id"]

    @admin.display(description="content")
    def preview(self, obj: Any) -> str:
        text: str = getattr(obj, "content_start", "") or ""
        return text[:PREVIEW_CHARS] + "…" if len(text) > PREVIEW_CHARS else text

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Memory | None = None) -> bool:
        return False

    # As a tool's delete: rows locked by id, and a chain's older memory passed on
    # along it (a plain delete freed it beside the chain's later memory).
    def delete_model(self, request: HttpRequest, obj: Memory) -> None:
        self._audit(request, [obj])
        services.delete_as_operator([obj.pk])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Memory]) -> None:
        doomed = list(queryset.only("id", "user_id", "namespace"))
        self._audit(request, doomed)
        services.delete_as_operator([memory.pk for memory in doomed])

    def _audit(self, request: HttpRequest, memories: list[Memory]) -> None:
        for memory in memories:
            logger.info(
                "memory deleted by operator",
                extra={
                    "memory_id": str(memory.pk),
                    "user_id": str(memory.user_id),
                    "namespace": memory.namespace,
                    "operator_id": str(request.user.pk),
                },
            )

"""Pieces the admin needs to stay fast on tables of millions of rows.

Django's admin counts the whole table for every list page (``COUNT(*)``),
and list filters offer every distinct value they find. On usage events or
memories both are full scans. ``EstimatedCountPaginator`` counts at most
``CAP`` matching rows and takes the planner's estimate for a whole table;
``InputFilter`` is a list filter that asks for a value instead of listing
them all.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils.functional import cached_property


class EstimatedCountPaginator(Paginator):
    """Count exactly up to ``CAP`` rows; past that, estimate from pg_class.reltuples.

    A filtered list with more than ``CAP`` matches reports ``CAP``. Only the
    first ``MAX_PAGES`` pages can be opened: a deep page is an OFFSET that
    reads every row before it, and on the operator path the planner, unable
    to estimate the row-level security clause, expects few rows and sorts
    them all. Narrowing the filter, or the CSV export, reaches the rest.
    """

    CAP = 10_000
    MAX_PAGES = 20

    @cached_property
    def num_pages(self) -> int:
        return min(super().num_pages, self.MAX_PAGES)

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return super().count
        # COUNT(*) over a LIMITed subquery stops after CAP + 1 rows.
        exact = queryset.order_by()[: self.CAP + 1].count()
        if exact <= self.CAP:
            return exact
        if not queryset.query.where:
            estimate = self._estimate(queryset)
            if estimate > self.CAP:
                return estimate
        return self.CAP

    @staticmethod
    def _estimate(queryset: QuerySet[Any]) -> int:
        with connections[queryset.db].cursor() as cursor:
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
                [queryset.model._meta.db_table],
            )
            row = cursor.fetchone()
        # -1 until the table is first vacuumed or analysed.
        return int(row[0]) if row and row[0] is not None else -1


class InputFilter(admin.SimpleListFilter):
    """A list filter with a text box, for columns with too many values to list."""

    template = "admin/input_filter.html"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # Non-empty, or the admin would not render the filter at all.
        return [("", "")]

    # The stub types choices() for Django's stock filter template; this
    # filter's own template also reads "others", the query's other parameters.
    def choices(self, changelist: Any) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        others = [
            (name, value)
            for name, values in changelist.get_filters_params().items()
            if name != self.parameter_name
            for value in (values if isinstance(values, list) else [values])
        ]
        yield {
            "selected": self.value() is not None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "All",
            "others": others,
        }


def count_per_user(queryset: QuerySet[Any]) -> Coalesce:
    """Return an annotation for a list of users: how many rows of ``queryset`` each owns."""
    # A correlated subquery, not a JOIN + GROUP BY: joining memories and keys
    # together would multiply rows. PostgreSQL evaluates it after the page's
    # LIMIT, so a list page costs one index count per row shown.
    counted = queryset.filter(user=OuterRef("pk")).order_by().values("user").annotate(n=Count("*"))
    return Coalesce(Subquery(counted.values("n"), output_field=IntegerField()), 0)


# Spreadsheets run cells that start with these as formulas.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(value: object) -> object:
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


class _Echo:
    def write(self, value: str) -> str:
        return value


def csv_line(row: Iterable[object]) -> str:
    return csv.writer(_Echo()).writerow([csv_safe(value) for value in row])

"""Memories from a raw statement's rows, loaded as the ORM loads them.

The searches read their rows through psycopg directly (``tenancy.read_once``,
the result cache's check); this turns such a row into the ``Memory`` the ORM
would have made of it, every field through its converters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection

from memories.models import Memory


@dataclass(frozen=True)
class _Loaded:
    attname: str
    column: Any  # the field's Col, which converters are handed
    converters: list[Callable[..., Any]]


_LOADED: dict[str, _Loaded] = {}


def _loaded_fields() -> dict[str, _Loaded]:
    """Memory's columns by name, with the converters the ORM applies when it loads them."""
    if not _LOADED:
        for field in Memory._meta.concrete_fields:
            column = field.get_col(Memory._meta.db_table)
            converters = connection.ops.get_db_converters(column) + column.get_db_converters(
                connection
            )
            _LOADED[field.column] = _Loaded(field.attname, column, converters)
    return _LOADED


class Loader:
    """Loads ``Memory`` objects from rows whose columns are ``names`` (others are skipped)."""

    def __init__(self, names: Sequence[str]) -> None:
        fields = _loaded_fields()
        self.loaded = [(i, fields[name]) for i, name in enumerate(names) if name in fields]
        self.attnames = [spec.attname for _, spec in self.loaded]

    def __call__(self, row: Sequence[Any]) -> Memory:
        values = []
        for i, spec in self.loaded:
            value = row[i]
            for convert in spec.converters:
                value = convert(value, spec.column, connection)
            values.append(value)
        return Memory.from_db(connection.alias, self.attnames, values)

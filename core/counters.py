"""Counters kept per scope, for the caches that tenants share.

The query cache (``memories/embeddings/cache.py``) and the result cache
(``memories/results.py``) both count, per scope, what they hold and how its
lookups went, so that a caller is told its own figures and never another's.
Each keeps its counters in a ``Book``, a dataclass of numbers per scope with
``size`` (the entries it holds) among them.

A book holds at most ``max_scopes`` scopes, the least recently active first
out, but never one that still holds entries: its size and bytes would start
again from nothing while its entries stayed. It is not thread-safe: each cache
calls it under its own lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import fields
from typing import Any, ClassVar, Generic, Protocol, TypeVar

# Counters are kept for at most this many scopes.
MAX_SCOPES = 100_000


class Counting(Protocol):
    """A dataclass of counters, all numbers, whose ``size`` is the entries a scope holds."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    size: int


C = TypeVar("C", bound=Counting)


class Book(Generic[C]):
    """The counters of every scope, of one dataclass ``kind``, the least recently active first."""

    def __init__(self, kind: type[C], *, max_scopes: int = MAX_SCOPES) -> None:
        self.kind = kind
        self.max_scopes = max_scopes
        self.scopes: OrderedDict[str, C] = OrderedDict()

    def of(self, owner: str) -> C:
        """``owner``'s counters, to change: made when missing, and marked most recently active."""
        counters = self.scopes.get(owner)
        if counters is None:
            counters = self.scopes[owner] = self.kind()
            while len(self.scopes) > self.max_scopes:
                # Never drop a scope that still holds entries: its size would go wrong.
                idle = next(
                    (name for name, c in self.scopes.items() if c.size == 0 and name != owner),
                    None,
                )
                if idle is None:
                    break
                del self.scopes[idle]
        else:
            self.scopes.move_to_end(owner)
        return counters

    def peek(self, owner: str) -> C:
        """``owner``'s counters as they are (zeros when it has none), its place unchanged."""
        return self.scopes.get(owner) or self.kind()

    def total(self) -> C:
        """Every scope's counters added up, field by field (operators' figures)."""
        total = self.kind()
        names = [f.name for f in fields(total)]
        for counters in self.scopes.values():
            for name in names:
                setattr(total, name, getattr(total, name) + getattr(counters, name))
        return total

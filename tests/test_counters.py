"""The per-scope counters both caches keep (``core/counters.py``), at their bound."""

from __future__ import annotations

from dataclasses import dataclass

from core.counters import Book


@dataclass
class Tally:
    size: int = 0
    hits: int = 0
    seconds: float = 0.0


def test_a_full_book_drops_the_least_recently_active_idle_scope():
    book = Book(Tally, max_scopes=2)
    book.of("alice").hits += 1
    book.of("bob").hits += 1
    book.of("alice").hits += 1  # alice is now the more recently active

    book.of("charlie")

    assert list(book.scopes) == ["alice", "charlie"]
    assert book.peek("alice").hits == 2


def test_a_full_book_never_drops_a_scope_that_holds_entries_nor_the_newcomer():
    book = Book(Tally, max_scopes=2)
    book.of("alice").size += 1
    book.of("bob").size += 1

    book.of("charlie").hits += 1  # over the bound rather than forget a holder's size

    assert list(book.scopes) == ["alice", "bob", "charlie"]
    book.of("bob").size -= 1
    book.of("dave")
    assert list(book.scopes) == ["alice", "dave"]
    assert book.peek("alice").size == 1


def test_peeking_at_an_unknown_scope_gives_zeros_and_adds_nothing():
    book = Book(Tally)

    assert book.peek("alice") == Tally()
    assert book.scopes == {}


def test_the_total_adds_up_every_field_of_every_scope():
    book = Book(Tally)
    alice = book.of("alice")
    alice.size, alice.hits, alice.seconds = 2, 3, 0.5
    charlie = book.of("charlie")
    charlie.size, charlie.hits, charlie.seconds = 1, 4, 0.25

    assert book.total() == Tally(size=3, hits=7, seconds=0.75)
    assert book.peek("alice") == Tally(2, 3, 0.5)  # the total is a new tally, not a scope's

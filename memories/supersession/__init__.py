"""Knowledge updates: whether a new memory replaces an older one.

- ``text``: what a short fact says (words, typed values, change words), read
  with simple rules;
- ``subjects``: which thing a memory is about, from its first words: two
  openings that name two things ("Room 101" / "Room 202", "The orders /
  users database") keep both;
- ``decide``: the offline decision, a pure function of the texts and their
  cosine similarity;
- ``llm``: the optional decision by an OpenAI-compatible chat model, for the
  candidates the offline rules find ambiguous, with a timeout and a fallback.

Design and phase B's wiring: ``docs/knowledge-updates.md``.
"""

from __future__ import annotations

from memories.supersession.decide import (
    Candidate,
    Decision,
    Verdict,
    apart,
    decide,
    hints,
    judge,
)
from memories.supersession.text import Reading, read

__all__ = [
    "Candidate",
    "Decision",
    "Reading",
    "Verdict",
    "apart",
    "decide",
    "hints",
    "judge",
    "read",
]

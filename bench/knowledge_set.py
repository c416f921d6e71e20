"""The knowledge-update set: chains of facts that change, look-alikes that do not, distractors.

``bench/data/knowledge_updates/{dev,test}.json`` (written for this benchmark,
every sentence invented) hold, per split:

- ``chains``: a fact stored, then replaced once or more (``memories`` in the
  order they are stored; the last is current), with questions whose answer
  is the current value. ``style`` says how the update is worded: ``change``
  (a change word: "moved", "now", "switched"), ``negation`` ("no longer",
  "not"), ``correction`` ("actually", "correction") or ``implicit`` (none).
- ``lookalikes``: two facts that are both true and must stay apart (a
  sister's city and a brother's, staging's host and production's, tea in the
  morning and wine at dinner, additions such as "also likes"), each with its
  own question.
- ``distractors``: unrelated facts.

``stream()`` lays one split out as one namespace's writes, in a fixed
order: every first version, first look-alike fact and half the distractors
in phase 0 (shuffled), every second version and second look-alike fact and
the other distractors in phase 1, and so on; so a replacement always comes
after what it replaces, and a look-alike's second fact after its first.

``simulate()`` runs the offline detector over that stream as the write path
would: each new memory against the few current memories nearest to it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "knowledge_updates"
SPLITS = ("dev", "dev2", "test")  # dev2: a second development part, by another hand
# Candidates the write path looks at: the nearest current memories.
CANDIDATES = 5


@dataclass(frozen=True)
class Item:
    """One memory to store."""

    key: str  # "chain:<id>:<n>", "lookalike:<id>:<n>" or "distractor:<n>"
    content: str
    role: str  # chain, lookalike, distractor
    group: str  # the chain's or look-alike's id
    index: int  # version (chains) or fact number (look-alikes)


@dataclass(frozen=True)
class Question:
    text: str
    role: str  # chain or lookalike
    group: str
    target: str  # key of the memory that answers it (a chain's current version)
    outdated: tuple[str, ...]  # keys of the chain's older versions
    style: str = ""


@dataclass
class Split:
    name: str
    chains: list[dict[str, Any]]
    lookalikes: list[dict[str, Any]]
    distractors: list[str]
    items: list[Item] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)

    @property
    def by_key(self) -> dict[str, Item]:
        return {item.key: item for item in self.items}


def load(name: str, data: Path = DATA) -> Split:
    raw = json.loads((data / f"{name}.json").read_text())
    split = Split(name, raw["chains"], raw["lookalikes"], raw["distractors"])
    split.items = stream(split)
    split.questions = questions(split)
    return split


def smoke(name: str = "dev", chains: int = 6, lookalikes: int = 4, distractors: int = 6) -> Split:
    """Return a small slice of a split, for smoke runs."""
    full = load(name)
    split = Split(
        name,
        full.chains[:chains],
        full.lookalikes[:lookalikes],
        full.distractors[:distractors],
    )
    split.items = stream(split)
    split.questions = questions(split)
    return split


def stream(split: Split, seed: int = 22) -> list[Item]:
    """Return the split's memories in the order they are stored."""
    phases: dict[int, list[Item]] = {}
    for chain in split.chains:
        for n, text in enumerate(chain["memories"]):
            phases.setdefault(n, []).append(
                Item(f"chain:{chain['id']}:{n}", text, "chain", chain["id"], n)
            )
    for group in split.lookalikes:
        for n, text in enumerate(group["facts"]):
            phases.setdefault(n, []).append(
                Item(f"lookalike:{group['id']}:{n}", text, "lookalike", group["id"], n)
            )
    for n, text in enumerate(split.distractors):
        phases.setdefault(n % 2, []).append(Item(f"distractor:{n}", text, "distractor", "", n))
    rng = random.Random(seed)
    out: list[Item] = []
    for phase in sorted(phases):
        batch = list(phases[phase])
        rng.shuffle(batch)
        out += batch
    return out


def questions(split: Split) -> list[Question]:
    out = []
    for chain in split.chains:
        last = len(chain["memories"]) - 1
        outdated = tuple(f"chain:{chain['id']}:{n}" for n in range(last))
        for text in chain["questions"]:
            out.append(
                Question(
                    text,
                    "chain",
                    chain["id"],
                    f"chain:{chain['id']}:{last}",
                    outdated,
                    chain.get("style", ""),
                )
            )
    for group in split.lookalikes:
        for n, text in enumerate(group["questions"]):
            out.append(Question(text, "lookalike", group["id"], f"lookalike:{group['id']}:{n}", ()))
    return out


def is_update(new: Item, old: Item) -> bool:
    """Whether ``new`` truly replaces ``old``: a later version of the same chain."""
    return new.role == old.role == "chain" and new.group == old.group and new.index > old.index


# The offline detector over the stream ------------------------------------------------


@dataclass
class Simulation:
    """Which memories the detector replaced, and by what, over one split's stream."""

    superseded: dict[str, str]  # old key -> new key
    decisions: list[tuple[Item, Item, Any]]  # (new, candidate, decision) for every candidate
    ambiguous: int = 0

    def summary(self, split: Split) -> dict[str, Any]:
        """Pair-level figures: updates found, and every wrong replacement by kind."""
        by_key = split.by_key
        updates = [i for i in split.items if i.role == "chain" and i.index > 0]
        found = sum(
            1
            for new in updates
            if any(
                self.superseded.get(f"chain:{new.group}:{n}") == new.key for n in range(new.index)
            )
        )
        wrong = [
            (by_key[old], by_key[new])
            for old, new in self.superseded.items()
            if not is_update(by_key[new], by_key[old])
        ]
        facts = [i for i in split.items if i.role == "lookalike"]
        currents = {
            f"chain:{c['id']}:{len(c['memories']) - 1}" for c in split.chains
        }  # a current fact replaced by anything is wrong too
        return {
            "updates": len(updates),
            "updates_found": found,
            "update_recall": round(found / len(updates), 4) if updates else 0.0,
            "supersessions": len(self.superseded),
            "wrong": len(wrong),
            "lookalike_facts": len(facts),
            "lookalikes_marked": sum(1 for f in facts if f.key in self.superseded),
            "lookalike_false_rate": round(
                sum(1 for f in facts if f.key in self.superseded) / len(facts), 4
            )
            if facts
            else 0.0,
            "currents_marked": sum(1 for k in currents if k in self.superseded),
            "distractors_marked": sum(1 for k in self.superseded if by_key[k].role == "distractor"),
            "ambiguous": self.ambiguous,
            **self.hinted(split),
            "wrong_pairs": [[new.content, old.content] for old, new in wrong],
        }

    def hinted(self, split: Split) -> dict[str, Any]:
        """What the writes' ``may_replace`` named: how many, how many true, which misses.

        Per write, the kept candidates ``supersession.hints`` names (at most
        ``HINTS``, the best first); a true hint names an earlier version of
        the new memory's chain that the detector did not link.
        """
        from memories.supersession import hints

        by_write: dict[str, list[tuple[Item, Any]]] = {}
        for new, old, decision in self.decisions:
            by_write.setdefault(new.key, []).append((old, decision))
        news = {new.key: new for new, _, _ in self.decisions}
        named: list[tuple[Item, Item]] = []
        for key, pairs in by_write.items():
            chosen = {d.id for d in hints([d for _, d in pairs])}
            named += [(news[key], old) for old, d in pairs if d.id in chosen]
        true = [(new, old) for new, old in named if is_update(new, old)]
        linked = set(self.superseded.items())  # (old key, new key)
        missed = [
            new
            for new in split.items
            if new.role == "chain"
            and new.index > 0
            and not any((f"chain:{new.group}:{n}", new.key) in linked for n in range(new.index))
        ]
        hinted = {new.key for new, _ in true}
        return {
            "hints": len(named),
            "hints_true": len(true),
            "hint_writes": len({new.key for new, _ in named}),
            "writes": len(split.items) - 1,
            "updates_missed": len(missed),
            "updates_missed_hinted": sum(1 for new in missed if new.key in hinted),
        }


def simulate(
    split: Split,
    vectors: dict[str, np.ndarray],
    judge: Callable[[str, Sequence[Any]], list[Any]],
    candidates: int = CANDIDATES,
) -> Simulation:
    """Run ``judge`` (``memories.supersession.decide``'s signature) as the write path would.

    Each new memory is compared with the ``candidates`` current memories
    nearest to it by cosine, among those stored before it; a superseded
    memory is no longer a candidate (the search leaves it out).
    """
    from memories.supersession import Candidate

    stored: list[Item] = []
    matrix: list[np.ndarray] = []
    superseded: dict[str, str] = {}
    decisions: list[tuple[Item, Item, Any]] = []
    ambiguous = 0
    for item in split.items:
        vector = vectors[item.content]
        if stored:
            sims = np.stack(matrix) @ vector
            order = [int(i) for i in np.argsort(-sims) if stored[int(i)].key not in superseded]
            near = order[:candidates]
            offered = [Candidate(stored[i].key, stored[i].content, float(sims[i])) for i in near]
            for i, decision in zip(near, judge(item.content, offered), strict=True):
                decisions.append((item, stored[i], decision))
                ambiguous += bool(getattr(decision, "ambiguous", False))
                if decision.verdict == "supersede":
                    superseded[stored[i].key] = item.key
        stored.append(item)
        matrix.append(vector)
    return Simulation(superseded, decisions, ambiguous)


def texts(split: Split) -> list[str]:
    return [item.content for item in split.items] + [q.text for q in split.questions]

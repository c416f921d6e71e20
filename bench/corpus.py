"""Texts and vectors for the benchmarks: SciFact, LoCoMo, a smoke sample, a cache.

The data's licences forbid copying it into the repository, so it is read from
``--data DIR``, a folder laid out as ``python bench/retrieval.py --help`` says.
Smoke runs use the few made-up texts below instead, so that they need no data
at all.

Embeddings are cached on disk, outside the repository, by text: a cached
vector is exactly what the model returned for that text (the local model's
rows do not depend on their batch-mates), so a cached run measures the same
vectors an uncached one would.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.similarity import split_abstract

DEFAULT_CACHE = Path("~/.cache/recall-bench")

# Smoke sample: invented, so it can live in the repository.
SMOKE_SENTENCES = [
    "The user prefers FastAPI over Flask for small web services.",
    "Deploys happen on Tuesdays after the morning standup.",
    "The staging database runs PostgreSQL with the pgvector extension.",
    "The user's daughter starts primary school in September.",
    "Invoices go out on the first working day of each month.",
    "The user is training for a spring marathon and runs before work.",
    "Production logs are shipped to a self-hosted Loki instance.",
    "The team decided to pin numpy below version three for now.",
    "The user keeps bees in the back garden and sells the honey.",
    "Code review needs two approvals for anything touching billing.",
    "The user dislikes meetings before ten in the morning.",
    "Coffee beans are ordered from a roaster in Lisbon every fortnight.",
    "The API rate limit for the free tier is ten requests a minute.",
    "The laptop is a ThinkPad with 32 GB of memory running Fedora.",
    "The user is allergic to peanuts and avoids satay dishes.",
    "Backups run nightly at two and are kept for thirty days.",
]
SMOKE_QUERIES = [
    "Which web framework does the user like?",
    "When are releases shipped?",
    "What database is used in staging?",
    "Does the user have any food allergies?",
]


# SciFact ----------------------------------------------------------------------


@dataclass
class SciFact:
    docs: dict[int, str]  # doc_id -> "title abstract"
    sentences: list[str]  # every abstract sentence, in corpus order
    sentence_doc: list[int]  # doc_id of each sentence
    claims: dict[int, str]  # claim id -> text
    cited: dict[int, set[int]] = field(default_factory=dict)  # claim id -> relevant doc ids


def load_scifact(data: Path) -> SciFact:
    docs: dict[int, str] = {}
    sentences: list[str] = []
    sentence_doc: list[int] = []
    with (data / "scifact" / "corpus.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            doc_id = int(row["doc_id"])
            body = split_abstract(row["abstract"])
            docs[doc_id] = f"{row['title']} {' '.join(body)}".strip()
            for sentence in body:
                sentences.append(sentence.strip())
                sentence_doc.append(doc_id)
    claims: dict[int, str] = {}
    cited: dict[int, set[int]] = {}
    with (data / "scifact" / "claims_train.csv").open(newline="") as f:
        # A claim has one row per evidence document; cited_doc_ids repeats.
        for row in csv.DictReader(f):
            claim = int(row["id"])
            claims[claim] = row["claim"]
            cited.setdefault(claim, set()).update(
                int(d) for d in re.findall(r"\d+", row["cited_doc_ids"])
            )
    return SciFact(docs, sentences, sentence_doc, claims, cited)


# LoCoMo -----------------------------------------------------------------------


@dataclass
class Turn:
    dia_id: str
    speaker: str
    text: str
    session: int
    date: str

    @property
    def content(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass
class Question:
    question: str
    evidence: list[str]
    category: int


@dataclass
class Conversation:
    sample_id: str
    turns: list[Turn]
    questions: list[Question]


def load_locomo(path: Path) -> list[Conversation]:
    return parse_locomo(json.loads(path.read_text()))


def parse_locomo(raw: list[dict[str, Any]]) -> list[Conversation]:
    conversations = []
    for item in raw:
        sessions = item["conversation"]
        turns: list[Turn] = []
        numbers = sorted(
            int(key.split("_")[1]) for key in sessions if re.fullmatch(r"session_\d+", key)
        )
        for number in numbers:
            date = sessions.get(f"session_{number}_date_time", "")
            for turn in sessions[f"session_{number}"]:
                turns.append(Turn(turn["dia_id"], turn["speaker"], turn["text"], number, date))
        questions = [
            Question(str(qa["question"]), list(qa.get("evidence", [])), int(qa["category"]))
            for qa in item["qa"]
        ]
        conversations.append(Conversation(str(item["sample_id"]), turns, questions))
    return conversations


# A LoCoMo-shaped conversation for smoke runs, invented.
SMOKE_LOCOMO: list[dict[str, Any]] = [
    {
        "sample_id": "smoke-1",
        "conversation": {
            "speaker_a": "Ada",
            "speaker_b": "Ben",
            "session_1_date_time": "9:00 am on 3 March, 2024",
            "session_1": [
                {"speaker": "Ada", "dia_id": "D1:1", "text": "I adopted a grey cat called Miso."},
                {"speaker": "Ben", "dia_id": "D1:2", "text": "Nice! I started learning the cello."},
                {"speaker": "Ada", "dia_id": "D1:3", "text": "Work sends me to Oslo next month."},
                {"speaker": "Ben", "dia_id": "D1:4", "text": "My sister is getting married."},
            ],
            "session_2_date_time": "6:30 pm on 20 April, 2024",
            "session_2": [
                {"speaker": "Ada", "dia_id": "D2:1", "text": "Oslo was cold but beautiful."},
                {"speaker": "Ben", "dia_id": "D2:2", "text": "The wedding was by a lake."},
                {"speaker": "Ada", "dia_id": "D2:3", "text": "Miso knocked my plants over."},
                {"speaker": "Ben", "dia_id": "D2:4", "text": "I played cello at the wedding."},
            ],
        },
        "qa": [
            {"question": "What is the name of Ada's cat?", "evidence": ["D1:1"], "category": 4},
            {"question": "Which city did Ada travel to?", "evidence": ["D1:3", "D2:1"],
             "category": 1},
            {"question": "When did Ada get her cat?", "evidence": ["D1:1"], "category": 2},
            {"question": "What instrument might Ben play at events?", "evidence": ["D2:4"],
             "category": 3},
            {"question": "What did Ben's cat knock over?", "evidence": ["D2:3"], "category": 5,
             "adversarial_answer": "plants"},
        ],
    }
]  # fmt: skip

SMOKE_DOCS = {
    1: "Caffeine and sleep. Evening caffeine delays sleep onset in adults.",
    2: "Exercise and memory. Aerobic exercise improves hippocampal memory in older adults.",
    3: "Statins and muscle pain. Statin users report muscle symptoms more often than controls.",
    4: "Vitamin D and fractures. Vitamin D supplements did not reduce fractures in this trial.",
    5: "Sleep and learning. Sleep after training consolidates motor skill learning.",
    6: "Smoking and lung cancer. Smoking strongly increases the risk of lung cancer.",
}
SMOKE_CLAIMS = {
    1: ("Coffee late in the day makes it harder to fall asleep.", {1}),
    2: ("Physical activity helps memory in the elderly.", {2}),
    3: ("Vitamin D prevents bone fractures.", {4}),
    4: ("Sleeping consolidates newly learned skills.", {5}),
}


def smoke_scifact() -> SciFact:
    return SciFact(
        docs=dict(SMOKE_DOCS),
        sentences=list(SMOKE_SENTENCES),
        sentence_doc=list(range(len(SMOKE_SENTENCES))),
        claims={k: text for k, (text, _) in SMOKE_CLAIMS.items()},
        cited={k: set(docs) for k, (_, docs) in SMOKE_CLAIMS.items()},
    )


# The embedding cache ----------------------------------------------------------


class EmbeddingCache:
    """Vectors by text for one model, kept in ``<dir>/<model>-<weights>.npz``."""

    def __init__(self, directory: Path | None, model_key: str) -> None:
        self.path = (
            None if directory is None else directory.expanduser() / f"{_slug(model_key)}.npz"
        )
        self._vectors: dict[str, np.ndarray] = {}
        self._dirty = False
        if self.path is not None and self.path.is_file():
            with np.load(self.path) as stored:
                for key, vector in zip(stored["keys"], stored["vectors"], strict=True):
                    self._vectors[str(key)] = vector

    def __len__(self) -> int:
        return len(self._vectors)

    def get(self, text: str) -> np.ndarray | None:
        return self._vectors.get(_key(text))

    def put(self, text: str, vector: np.ndarray) -> None:
        self._vectors[_key(text)] = np.asarray(vector, dtype=np.float32)
        self._dirty = True

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self._vectors), dtype="U64")
        vectors = np.stack(list(self._vectors.values())).astype(np.float32)
        partial = self.path.with_suffix(".tmp.npz")
        np.savez(partial, keys=keys, vectors=vectors)
        partial.replace(self.path)
        self._dirty = False


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def embed_texts(
    embedder: Any, texts: Sequence[str], cache: EmbeddingCache, *, progress: str = ""
) -> np.ndarray:
    """Return one vector per text, embedding (in batches) only what the cache lacks."""
    missing = sorted({t for t in texts if cache.get(t) is None})
    chunk = 2048
    for start in range(0, len(missing), chunk):
        part = missing[start : start + chunk]
        for text, vector in zip(part, embedder.embed(part), strict=True):
            cache.put(text, vector)
        cache.save()
        if progress:
            done = min(start + chunk, len(missing))
            print(f"  {progress}: embedded {done:,}/{len(missing):,}", flush=True)
    out = np.empty((len(texts), embedder.dimensions), dtype=np.float32)
    for row, text in enumerate(texts):
        vector = cache.get(text)
        assert vector is not None
        out[row] = vector
    return out


# Perturbation -----------------------------------------------------------------


def perturb(base: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Return unit vectors near ``base``: each row plus N(0, sigma^2) per component.

    Per unit-norm row in d dimensions the noise has norm ~ sigma * sqrt(d), so
    the result's cosine to its own base is ~ 1 / sqrt(1 + d * sigma^2) and two
    perturbations of one base meet at ~ 1 / (1 + d * sigma^2).
    """
    noisy = base + rng.normal(0.0, sigma, base.shape).astype(np.float32)
    return (noisy / np.linalg.norm(noisy, axis=1, keepdims=True)).astype(np.float32)

"""The embedder interface, and the rules every provider's vectors follow."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from core.errors import EmbeddingUnavailable

_MODEL_ID_CHARS = re.compile(r"[^A-Za-z0-9._:/-]+")


class Embedder(ABC):
    """Turn texts into L2-normalised float32 vectors of one model."""

    model_id: str
    # The model's similarity threshold: the cosine at which its related and
    # unrelated pairs part. The score reads similarity against it
    # (memories/scoring.py); the search's threshold is on the score.
    default_threshold: float

    @property
    @abstractmethod
    def dimensions(self) -> int: ...

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return an ``(n, dimensions)`` float32 array, one unit row per text, in order."""

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    @abstractmethod
    def load(self) -> None:
        """Get ready to embed now rather than on first use. Safe to call again."""

    @property
    @abstractmethod
    def is_loaded(self) -> bool: ...


def text_list(texts: Sequence[str]) -> list[str]:
    # A lone string is a Sequence[str] too, and would embed letter by letter.
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts; use embed_one() for one text")
    items = list(texts)
    for text in items:
        if not isinstance(text, str):
            raise TypeError(f"embed() takes texts, not {type(text).__name__}")
    return items


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Scale each row to unit length, as float32; refuse a row that has none.

    The length is taken in float64: a row of large but finite float32
    values (1e20) has a length float32 cannot hold, and dividing by that
    infinity stored a zero vector, which ranks first for every query.
    """
    wide = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(wide, axis=1, keepdims=True)
    if not (np.all(np.isfinite(wide)) and np.all(np.isfinite(norms)) and np.all(norms > 0)):
        raise EmbeddingUnavailable("The embedding model returned an unusable vector.")
    unit = (wide / norms).astype(np.float32)
    if not np.all(np.isfinite(unit)) or not np.all(unit.any(axis=1)):
        raise EmbeddingUnavailable("The embedding model returned an unusable vector.")
    return unit


def clean_model_id(name: str) -> str:
    """Return ``name`` fit to record on a memory row and in an index's WHERE."""
    cleaned = _MODEL_ID_CHARS.sub("-", name).strip("-")[:100]
    return cleaned or "unnamed-model"

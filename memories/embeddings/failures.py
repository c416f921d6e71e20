"""How a provider's failure reaches callers: as ``EmbeddingUnavailable``, and nothing more.

Every embedding a service asks for (a memory's content, an import's batch, a
search's query) goes through ``embed_texts`` or ``embed_query`` here, so the
rule is written once: a ``RecallError`` passes as it is; anything else is
logged (with the model, never the text) and becomes ``EmbeddingUnavailable``,
whose message repeats neither the input, the key nor the provider's words.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import numpy as np

from core.errors import EmbeddingUnavailable, RecallError
from memories.embeddings.base import Embedder
from memories.embeddings.cache import QueryCache

logger = logging.getLogger("memories.services")


class Outcomes:
    """How this process's embedding calls have gone lately, for ``health_check``.

    A model that loaded can still fail every call (a provider down, a key
    revoked); the latest outcome says so. Failing means the latest call
    failed, within ``window`` seconds: a success, or a quiet spell, clears it.
    """

    def __init__(self, window: float = 300.0) -> None:
        self.window = window
        self._lock = threading.Lock()
        self._failed_at: float | None = None

    def succeeded(self) -> None:
        with self._lock:
            self._failed_at = None

    def failed(self) -> None:
        with self._lock:
            self._failed_at = time.monotonic()

    def failing_for(self) -> float | None:
        """Seconds since the latest call failed, if it did within the window; else None."""
        with self._lock:
            failed_at = self._failed_at
        if failed_at is None:
            return None
        ago = time.monotonic() - failed_at
        return ago if ago <= self.window else None


outcomes = Outcomes()


@contextlib.contextmanager
def unavailable_on_failure(embedder: Embedder) -> Iterator[None]:
    try:
        yield
    except EmbeddingUnavailable:
        outcomes.failed()
        raise
    except RecallError:
        raise
    except Exception:
        outcomes.failed()
        logger.exception("embedding failed", extra={"model": embedder.model_id})
        raise EmbeddingUnavailable(
            "The embedding model could not process this request. Try again shortly."
        ) from None
    outcomes.succeeded()


def embed_texts(embedder: Embedder, texts: list[str]) -> list[np.ndarray]:
    """Return one vector per text, in order; one text shares a model run with concurrent calls."""
    with unavailable_on_failure(embedder):
        if len(texts) == 1:  # through the batcher, with concurrent calls
            return [embedder.embed_one(texts[0])]
        return list(embedder.embed(texts))


def embed_query(
    cache: QueryCache, embedder: Embedder, text: str, *, scope: str, use_cache: bool = True
) -> tuple[np.ndarray, str]:
    """Return a query's vector through the query cache in the caller's ``scope``, and its source."""
    with unavailable_on_failure(embedder):
        return cache.embed(embedder, text, scope=scope, use_cache=use_cache)

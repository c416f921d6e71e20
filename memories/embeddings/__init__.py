"""Turn text into unit vectors, with the provider chosen by settings.

``get_embedder()`` returns the process-wide embedder, built from settings on
first use and rebuilt when an embedding setting changes. One module per part:

- ``base``: the ``Embedder`` interface and the rules every provider's vectors
  follow (float32, unit length, a clean model id);
- ``local``: the default provider, all-MiniLM-L6-v2 (or another ONNX export)
  run in process by onnxruntime;
- ``batcher``: how concurrent single-text embeddings share one model run;
- ``openai``: OpenAI's embeddings endpoint, or any server speaking its wire
  format;
- ``cache``: query vectors kept for repeated queries, in process and in Redis.

Searches embed their query through ``get_query_cache()``, in the caller's scope.

Every failure of a provider surfaces as ``EmbeddingUnavailable``. Its message
never repeats the input text, the API key or the provider's own error text.
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

from memories.embeddings.base import Embedder, clean_model_id
from memories.embeddings.batcher import Batcher
from memories.embeddings.cache import QueryCache
from memories.embeddings.local import (
    BUNDLED_DIMENSIONS,
    BUNDLED_DIR,
    BUNDLED_MODEL_ID,
    BUNDLED_ONNX_SHA256,
    BUNDLED_TOKENIZER_SHA256,
    LOCAL_THRESHOLD,
    MAX_TOKENS,
    LocalEmbedder,
    intra_op_threads,
)
from memories.embeddings.openai import (
    OPENAI_MAX_BATCH,
    OPENAI_THRESHOLD,
    OPENAI_WIDTHS,
    OpenAIEmbedder,
)

__all__ = [
    "BUNDLED_DIMENSIONS",
    "BUNDLED_DIR",
    "BUNDLED_MODEL_ID",
    "BUNDLED_ONNX_SHA256",
    "BUNDLED_TOKENIZER_SHA256",
    "LOCAL_THRESHOLD",
    "MAX_TOKENS",
    "OPENAI_MAX_BATCH",
    "OPENAI_THRESHOLD",
    "OPENAI_WIDTHS",
    "Batcher",
    "Embedder",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "QueryCache",
    "build_embedder",
    "clean_model_id",
    "get_embedder",
    "get_query_cache",
    "intra_op_threads",
    "model_spec",
    "reset_embedder",
    "reset_query_cache",
]

_embedder: Embedder | None = None
_embedder_lock = threading.Lock()


def build_embedder() -> Embedder:
    """Return a new embedder built from settings, without loading its model.

    Its ``default_threshold`` is the model's own similarity threshold, which
    the score reads similarity against (memories/scoring.py);
    RECALL_DEFAULT_THRESHOLD is the default threshold on the score, not this.
    """
    if settings.EMBEDDING_PROVIDER == "openai":
        return OpenAIEmbedder(
            api_key=settings.OPENAI_API_KEY,
            model=settings.OPENAI_EMBEDDING_MODEL,
            base_url=settings.OPENAI_BASE_URL,
            dimensions=settings.OPENAI_EMBEDDING_DIMENSIONS,
            timeout=settings.OPENAI_TIMEOUT,
            max_retries=settings.OPENAI_MAX_RETRIES,
            batch_size=settings.EMBEDDING_BATCH_SIZE,
        )
    return LocalEmbedder(settings.RECALL_LOCAL_MODEL_DIR, batch_size=settings.EMBEDDING_BATCH_SIZE)


def get_embedder() -> Embedder:
    global _embedder
    embedder = _embedder
    if embedder is None:
        with _embedder_lock:
            if _embedder is None:
                _embedder = build_embedder()
            embedder = _embedder
    return embedder


def reset_embedder() -> None:
    global _embedder
    with _embedder_lock:
        _embedder = None


_query_cache: QueryCache | None = None


def get_query_cache() -> QueryCache:
    global _query_cache
    cache = _query_cache
    if cache is None:
        with _embedder_lock:
            if _query_cache is None:
                _query_cache = QueryCache(
                    max_entries=settings.QUERY_CACHE_SIZE,
                    ttl=settings.QUERY_CACHE_TTL_SECONDS,
                    redis_url=settings.REDIS_URL,
                )
            cache = _query_cache
    return cache


def reset_query_cache() -> None:
    global _query_cache
    with _embedder_lock:
        if _query_cache is not None:
            _query_cache.close()
        _query_cache = None


def model_spec() -> tuple[str, int]:
    """Return ``(model_id, dimensions)`` of the configured model.

    Loads nothing and sends nothing when the width is known from the model's
    name or config; an unknown OpenAI-compatible model costs one request.
    """
    embedder = get_embedder()
    return embedder.model_id, embedder.dimensions


_SETTINGS = {
    "EMBEDDING_PROVIDER",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_EMBEDDING_MODEL",
    "OPENAI_EMBEDDING_DIMENSIONS",
    "OPENAI_TIMEOUT",
    "OPENAI_MAX_RETRIES",
    "EMBEDDING_BATCH_SIZE",
    "RECALL_LOCAL_MODEL_DIR",
}


_CACHE_SETTINGS = {"QUERY_CACHE_SIZE", "QUERY_CACHE_TTL_SECONDS", "REDIS_URL"}


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    # So that override_settings in tests takes effect without a manual reset.
    if setting in _SETTINGS:
        reset_embedder()
    if setting in _SETTINGS | _CACHE_SETTINGS:
        reset_query_cache()


setting_changed.connect(_settings_changed)

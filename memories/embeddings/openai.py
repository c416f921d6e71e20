"""The OpenAI provider: the embeddings endpoint of OpenAI or of any server speaking its wire format.

``OPENAI_BASE_URL`` points it at Ollama, vLLM and the like. Retries of 408,
409, 429, 5xx, timeouts and connection errors, with exponential backoff that
honours ``Retry-After``, are the SDK's own (``OPENAI_MAX_RETRIES``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from core.errors import EmbeddingUnavailable
from memories.embeddings.base import Embedder, clean_model_id, normalise, text_list

logger = logging.getLogger(__name__)

# The product spec's default similarity threshold, chosen for OpenAI's models;
# not measured here. The score reads their similarity against it
# (memories/scoring.py).
OPENAI_THRESHOLD = 0.7

OPENAI_WIDTHS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}
# The embeddings endpoint takes at most this many inputs per request.
OPENAI_MAX_BATCH = 2048


class OpenAIEmbedder(Embedder):
    def __init__(
        self,
        *,
        api_key: str,
        model: str = "text-embedding-3-small",
        base_url: str | None = None,
        dimensions: int = 0,
        timeout: float = 30.0,
        max_retries: int = 3,
        batch_size: int = 64,
        threshold: float | None = None,
    ) -> None:
        self.model = model
        self.batch_size = max(1, min(batch_size, OPENAI_MAX_BATCH))
        self.default_threshold = OPENAI_THRESHOLD if threshold is None else threshold
        self._api_key = api_key
        self._base_url = base_url
        self._timeout = timeout
        self._max_retries = max_retries
        self._lock = threading.Lock()
        self._client: Any = None
        native = OPENAI_WIDTHS.get(model)
        # text-embedding-3 models shorten their vectors on request. For other
        # models the setting only declares a width Recall does not know, and
        # servers such as vLLM reject the parameter.
        self._request_dimensions = (
            dimensions if dimensions and model.startswith("text-embedding-3") else None
        )
        self._dimensions: int | None = dimensions or native
        model_id = model
        if self._request_dimensions and self._request_dimensions != native:
            # A shortened vector lives in its own space: keep it apart in the index.
            model_id = f"{model}:{self._request_dimensions}"
        self.model_id = clean_model_id(model_id)

    def __repr__(self) -> str:
        # Never let a debugger or log line show the key.
        return f"<OpenAIEmbedder model={self.model!r}>"

    @property
    def dimensions(self) -> int:
        if self._dimensions is None:
            self.load()
        assert self._dimensions is not None
        return self._dimensions

    @property
    def is_loaded(self) -> bool:
        return self._client is not None and self._dimensions is not None

    def load(self) -> None:
        if self.is_loaded:
            return
        with self._lock:
            if self._client is None:
                import openai

                from core import deadline

                self._client = openai.OpenAI(
                    # Self-hosted servers such as Ollama ignore the key, and
                    # settings refuse a missing one outside DEBUG.
                    api_key=self._api_key or "unset",
                    base_url=self._base_url,
                    timeout=self._timeout,
                    max_retries=self._max_retries,
                    # OPENAI_TIMEOUT bounds each request whole, not each read.
                    http_client=deadline.client(self._timeout),
                )
            if self._dimensions is None:
                # An unknown model: one request tells its width.
                self._dimensions = len(self._request(["width probe"], check_width=False)[0])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = text_list(texts)
        self.load()
        if not items:
            return np.empty((0, self.dimensions), dtype=np.float32)
        parts = [
            self._request(items[start : start + self.batch_size])
            for start in range(0, len(items), self.batch_size)
        ]
        return np.concatenate(parts)

    def _request(self, batch: list[str], *, check_width: bool = True) -> np.ndarray:
        kwargs: dict[str, Any] = {
            "model": self.model,
            # The API rejects empty strings; a space embeds the same nothing.
            "input": [text or " " for text in batch],
        }
        if self._request_dimensions:
            kwargs["dimensions"] = self._request_dimensions
        failure = None
        try:
            response = self._client.embeddings.create(**kwargs)
            rows = sorted(response.data, key=lambda item: item.index)
            indexes = [item.index for item in rows]
            vectors = np.array([item.embedding for item in rows], dtype=np.float32)
        except Exception as exc:
            failure = self._describe(exc)
        # Raised outside the except block so that the SDK's exception, whose
        # text may quote the key or the input, is not chained to ours.
        if failure:
            raise EmbeddingUnavailable(failure)
        if indexes != list(range(len(batch))) or vectors.ndim != 2:
            raise EmbeddingUnavailable(
                f"The embedding service returned {len(rows)} vectors for {len(batch)} inputs "
                f"from model {self.model}."
            )
        if check_width and vectors.shape[1] != self.dimensions:
            raise EmbeddingUnavailable(
                f"The embedding service returned {vectors.shape[1]}-dimensional vectors for "
                f"model {self.model}; Recall expected {self.dimensions}. Check "
                "OPENAI_EMBEDDING_MODEL and OPENAI_EMBEDDING_DIMENSIONS."
            )
        return normalise(vectors)

    def _describe(self, exc: Exception) -> str:
        import openai

        name = f"The embedding service (model {self.model})"
        logger.warning(
            "embedding request failed",
            extra={
                "model": self.model,
                "error": type(exc).__name__,
                "status": getattr(exc, "status_code", None),
            },
        )
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            return f"{name} refused the API key (HTTP {exc.status_code}). Check OPENAI_API_KEY."
        if isinstance(exc, openai.APITimeoutError):
            return (
                f"{name} did not answer within {self._timeout:g} seconds, "
                f"after {self._max_retries} retries."
            )
        if isinstance(exc, openai.APIConnectionError):
            return f"{name} could not be reached, after {self._max_retries} retries."
        if isinstance(exc, openai.RateLimitError):
            return f"{name} is rate limiting requests, still after {self._max_retries} retries."
        if isinstance(exc, openai.APIStatusError):
            return f"{name} answered HTTP {exc.status_code}."
        return f"{name} sent a response Recall could not read."

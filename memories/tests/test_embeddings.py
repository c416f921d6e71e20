"""The embedding providers: the bundled local model and OpenAI-compatible servers.

These tests need no database. The OpenAI provider talks to a real HTTP server
on 127.0.0.1 that speaks the embeddings wire format, through the real SDK.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.errors import EmbeddingUnavailable
from memories import embeddings, search
from memories.embeddings import LocalEmbedder, OpenAIEmbedder
from memories.embeddings import local as local_provider
from memories.tests.fake_openai import FakeOpenAI, Reply, fake_vector, serving, unit

API_KEY = "sk-test-0123456789abcdefSECRET"
SECRET_TEXT = "my bank PIN is 4921"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_singleton() -> Iterator[None]:
    embeddings.reset_embedder()
    yield
    embeddings.reset_embedder()


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    embedder = LocalEmbedder()
    embedder.load()
    return embedder


# The local model ---------------------------------------------------------------


def test_it_embeds_texts_as_unit_float32_rows_of_384_dimensions(local):
    vectors = local.embed(["The cat sat on the mat.", "", "Ünïcödé and emoji 🎉 survive."])

    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert local.embed_one("The cat sat on the mat.").shape == (384,)
    assert local.embed([]).shape == (0, 384)


def test_it_ranks_the_related_memory_above_unrelated_ones(local):
    query = local.embed_one("What are the user's web framework preferences?")
    related = "The user prefers FastAPI over Flask for web services."
    unrelated = [
        "I went hiking in the Alps last summer.",
        "My cat is called Whiskers.",
        "The stock market fell sharply today.",
        "Paris is the capital of France.",
        "She baked a chocolate cake for the party.",
        "Remember to water the plants on Tuesday.",
        "The meeting was moved to 3pm.",
        "He plays the violin in an orchestra.",
        "Quantum computers use qubits.",
        "The train to Berlin was late again.",
    ]
    scores = local.embed([related, *unrelated]) @ query

    assert scores[0] > scores[1:].max() + 0.2
    assert scores[0] >= local.default_threshold
    assert scores[1:].max() < local.default_threshold


def test_it_agrees_with_sentence_transformers_published_similarities(local):
    # all-MiniLM-L6-v2's similarities for these sentences in the
    # sentence-transformers quickstart: 0.6660, 0.1046, 0.1411 (fp32 weights).
    # int8 weights move them by a few thousandths; a broken tokenizer, pooling
    # or normalisation moves them by far more.
    a, b, c = local.embed(
        ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    )

    assert a @ b == pytest.approx(0.6660, abs=0.01)
    assert a @ c == pytest.approx(0.1046, abs=0.01)
    assert b @ c == pytest.approx(0.1411, abs=0.01)


def test_it_is_deterministic(local):
    texts = ["Alice likes green tea.", "Bob's flight leaves at 6am from Gatwick."]

    assert np.array_equal(local.embed(texts), local.embed(texts))
    assert np.array_equal(LocalEmbedder().embed(texts), local.embed(texts))


def test_it_gives_the_same_vectors_in_batches_as_one_by_one():
    embedder = LocalEmbedder(batch_size=3)
    texts = [
        "short",
        "A considerably longer sentence, so that batches need padding, about databases.",
        "Medium length text about coffee.",
        "x",
        "Another long one: the quarterly report shows revenue grew in every region but one.",
        "tea",
        "The user's daughter starts school in September.",
    ]

    together = embedder.embed(texts)
    alone = np.stack([embedder.embed_one(text) for text in texts])

    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_it_truncates_at_256_tokens_not_at_the_tokenizer_files_128(local):
    # "cat" and "dog" are one word piece each; with [CLS] and [SEP], 254 fit.
    def text(prefix: int, tail: str) -> str:
        return " ".join(["cat"] * prefix + [tail] * (300 - prefix))

    beyond_limit = local.embed([text(254, "dog"), text(254, "bird")])
    within_limit = local.embed([text(200, "dog"), text(200, "bird")])

    np.testing.assert_allclose(beyond_limit[0], beyond_limit[1], atol=1e-6)
    assert within_limit[0] @ within_limit[1] < 0.999


def test_it_embeds_from_many_threads_at_once(local):
    texts = [f"Memory {i}: the user mentioned topic number {i * 7} on day {i}." for i in range(48)]
    expected = {text: local.embed_one(text) for text in texts}

    def work(offset: int) -> list[tuple[str, np.ndarray]]:
        chosen = texts[offset::4]
        return list(zip(chosen, local.embed(chosen), strict=True)) + [
            (text, local.embed_one(text)) for text in chosen
        ]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = [pair for batch in pool.map(work, [0, 1, 2, 3] * 4) for pair in batch]

    assert len(results) == 2 * 48 * 4
    for text, vector in results:
        np.testing.assert_allclose(vector, expected[text], atol=1e-5)


def test_it_loads_the_model_only_when_asked_and_only_once():
    embedder = LocalEmbedder()
    assert not embedder.is_loaded
    assert (embedder.model_id, embedder.dimensions) == ("all-MiniLM-L6-v2", 384)
    assert not embedder.is_loaded

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda _: embedder.load(), range(4)))
    session = embedder._session
    embedder.load()

    assert embedder.is_loaded
    assert embedder._session is session


def test_it_loads_on_first_embed():
    embedder = LocalEmbedder()

    embedder.embed_one("hello")

    assert embedder.is_loaded


def test_it_refuses_a_model_file_whose_hash_is_wrong(tmp_path, monkeypatch):
    forged = tmp_path / "model.onnx"
    forged.write_bytes(b"not the model")
    monkeypatch.setattr(local_provider, "_bundled_onnx_path", lambda: forged)

    with pytest.raises(EmbeddingUnavailable) as caught:
        LocalEmbedder().load()

    assert str(forged) in caught.value.message
    assert "corrupt" in caught.value.message


def test_it_reports_a_missing_model_file(tmp_path, monkeypatch):
    missing = tmp_path / "gone" / "model.onnx"
    monkeypatch.setattr(local_provider, "_bundled_onnx_path", lambda: missing)

    with pytest.raises(EmbeddingUnavailable) as caught:
        LocalEmbedder().embed_one(SECRET_TEXT)

    assert str(missing) in caught.value.message
    assert SECRET_TEXT not in caught.value.message


def test_it_hashes_a_model_file_once_per_process(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"original bytes")
    digest = hashlib.sha256(b"original bytes").hexdigest()

    local_provider._verify(path, digest)
    path.write_bytes(b"changed after the first check")
    local_provider._verify(path, digest)

    with pytest.raises(EmbeddingUnavailable):
        local_provider._verify(tmp_path / "other.bin", digest)


def test_it_ships_the_tokenizer_it_pins():
    tokenizer = embeddings.BUNDLED_DIR / "tokenizer.json"
    notice = (embeddings.BUNDLED_DIR / "README.md").read_text()

    digest = hashlib.sha256(tokenizer.read_bytes()).hexdigest()

    assert digest == embeddings.BUNDLED_TOKENIZER_SHA256
    assert digest in notice
    assert "Apache" in notice


def test_it_rejects_a_string_where_a_list_of_texts_belongs(local):
    with pytest.raises(TypeError):
        local.embed("one text")


# Batching concurrent callers ------------------------------------------------------


def test_it_gives_concurrent_callers_the_vectors_they_get_one_by_one(local):
    texts = [f"Caller {i} asks what the user said about topic {i * 3}." for i in range(32)]
    expected = local.embed(texts)
    start = threading.Barrier(len(texts))
    runs_before = local._batcher.runs

    def call(text: str) -> np.ndarray:
        start.wait()
        return local.embed_one(text)

    with ThreadPoolExecutor(max_workers=len(texts)) as pool:
        got = np.stack(list(pool.map(call, texts)))

    np.testing.assert_allclose(got, expected, atol=1e-5)
    # Callers that arrived while the model ran were served together.
    assert local._batcher.runs - runs_before < len(texts)


class GatedRun:
    """A stand-in for the model run: records each batch, can hold the first one."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.started = threading.Event()
        self.fail = fail

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.batches.append(list(texts))
        self.started.set()
        self.release.wait(10)
        if self.fail is not None and len(self.batches) > 1:
            raise self.fail
        return np.array([[float(len(text)), 1.0] for text in texts], dtype=np.float32)


def submit_in_threads(batcher: embeddings.Batcher, texts: list[str]) -> list[Any]:
    results: list[Any] = [None] * len(texts)

    def call(index: int) -> None:
        try:
            results[index] = batcher.submit(texts[index])
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    return [threads, results]


def test_it_runs_texts_that_queue_during_a_run_as_the_next_batch():
    run = GatedRun()
    batcher = embeddings.Batcher(run)
    threads, results = submit_in_threads(batcher, ["first"])
    assert run.started.wait(5)
    more_threads, more = submit_in_threads(batcher, ["a", "bb", "ccc", "dddd"])
    deadline = time.monotonic() + 5
    while len(batcher._queue) < 4 and time.monotonic() < deadline:
        time.sleep(0.001)

    run.release.set()
    for thread in threads + more_threads:
        thread.join(5)

    assert run.batches[0] == ["first"]
    assert sorted(run.batches[1]) == ["a", "bb", "ccc", "dddd"]
    assert [row[0] for row in results + more] == [5.0, 1.0, 2.0, 3.0, 4.0]


def test_it_runs_a_lone_text_at_once_in_the_callers_thread():
    callers = []

    def run(texts: list[str]) -> np.ndarray:
        callers.append(threading.current_thread())
        return np.ones((len(texts), 2), dtype=np.float32)

    batcher = embeddings.Batcher(run)
    for _ in range(5):
        batcher.submit("alone")

    assert callers == [threading.current_thread()] * 5
    assert batcher._thread is None  # no hand-off, no batching thread


def test_it_passes_a_failure_to_every_caller_of_the_batch():
    run = GatedRun(fail=EmbeddingUnavailable("The local embedding model failed to run."))
    batcher = embeddings.Batcher(run)
    threads, results = submit_in_threads(batcher, ["first"])
    assert run.started.wait(5)
    more_threads, more = submit_in_threads(batcher, ["a", "b", "c"])
    deadline = time.monotonic() + 5
    while len(batcher._queue) < 3 and time.monotonic() < deadline:
        time.sleep(0.001)

    run.release.set()
    for thread in threads + more_threads:
        thread.join(5)

    assert results[0][0] == 5.0  # the first batch succeeded
    assert all(isinstance(error, EmbeddingUnavailable) for error in more)
    assert len({id(error) for error in more}) == 3  # each caller raises its own
    assert {error.message for error in more} == {"The local embedding model failed to run."}
    # The batcher carries on after a failed batch.
    run.fail = None
    assert batcher.submit("later")[0] == 5.0


def test_it_stops_its_thread_when_idle_and_starts_it_again():
    batcher = embeddings.Batcher(GatedRun(), idle_exit=0.05)

    for _ in range(2):
        run = GatedRun()
        batcher._run = run
        threads, _ = submit_in_threads(batcher, ["first"])
        assert run.started.wait(5)
        queued, results = submit_in_threads(batcher, ["queued"])
        assert batcher._thread is not None
        run.release.set()
        for thread in threads + queued:
            thread.join(5)
        assert results[0][0] == 6.0
        deadline = time.monotonic() + 5
        while batcher._thread is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert batcher._thread is None


def test_it_splits_runs_where_padding_would_waste_work():
    lengths = [10, 10, 11, 12, 20, 21, 40]

    # No run padded by more than a fifth of its work...
    assert local_provider._chunks(list(range(7)), lengths, size=8) == [[0, 1, 2, 3], [4, 5], [6]]
    # ...and none longer than the batch size.
    assert local_provider._chunks(list(range(7)), lengths, size=2) == [[0, 1], [2, 3], [4, 5], [6]]


# Other local models --------------------------------------------------------------


def copy_bundled_model(directory: Path, *, onnx_subdir: bool = False, **config: Any) -> Path:
    directory.mkdir(parents=True)
    onnx = directory / "onnx" / "model.onnx" if onnx_subdir else directory / "model.onnx"
    onnx.parent.mkdir(exist_ok=True)
    shutil.copyfile(local_provider._bundled_onnx_path(), onnx)
    shutil.copyfile(embeddings.BUNDLED_DIR / "tokenizer.json", directory / "tokenizer.json")
    if config:
        (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_it_runs_a_model_from_recall_local_model_dir(tmp_path, local, settings):
    settings.RECALL_LOCAL_MODEL_DIR = str(
        copy_bundled_model(tmp_path / "my-minilm", onnx_subdir=True, hidden_size=384)
    )
    embedder = embeddings.get_embedder()

    assert embeddings.model_spec() == ("my-minilm", 384)
    assert not embedder.is_loaded
    text = "Charlie moved to Lisbon in March."
    np.testing.assert_allclose(embedder.embed_one(text), local.embed_one(text), atol=1e-6)


def test_it_takes_the_model_id_and_threshold_from_config_json(tmp_path):
    directory = copy_bundled_model(
        tmp_path / "export",
        hidden_size=384,
        recall_model_id="acme/minilm v2",
        recall_default_threshold=0.42,
    )

    embedder = LocalEmbedder(directory)

    assert embedder.model_id == "acme/minilm-v2"
    assert embedder.default_threshold == 0.42


def test_it_learns_the_width_by_running_a_model_without_config(tmp_path):
    embedder = LocalEmbedder(copy_bundled_model(tmp_path / "bare"))

    assert embedder.dimensions == 384


def test_it_refuses_a_config_whose_width_does_not_match_the_model(tmp_path):
    embedder = LocalEmbedder(copy_bundled_model(tmp_path / "wrong", hidden_size=768))

    with pytest.raises(EmbeddingUnavailable, match="recall_dimensions"):
        embedder.load()
    assert not embedder.is_loaded


def test_it_names_what_is_missing_from_a_model_dir(tmp_path):
    with pytest.raises(EmbeddingUnavailable, match="not a directory"):
        LocalEmbedder(tmp_path / "nowhere")

    (tmp_path / "empty").mkdir()
    with pytest.raises(EmbeddingUnavailable, match=r"model\.onnx"):
        LocalEmbedder(tmp_path / "empty").load()


class PooledSession:
    """An export whose graph already pools: one 2-D output, int32 inputs, no token types."""

    @dataclass
    class Port:
        name: str
        type: str = "tensor(int32)"

    def __init__(self) -> None:
        self.feeds: list[dict[str, np.ndarray]] = []

    def get_inputs(self) -> list[Port]:
        return [self.Port("input_ids"), self.Port("attention_mask")]

    def get_outputs(self) -> list[Port]:
        return [self.Port("token_embeddings"), self.Port("sentence_embedding")]

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        assert names == ["sentence_embedding"]
        self.feeds.append(feed)
        lengths = feed["attention_mask"].sum(axis=1).astype(np.float32)
        return [np.stack([lengths, np.full_like(lengths, 3.0)], axis=1)]


def test_it_uses_an_already_pooled_output_as_it_is(tmp_path, monkeypatch):
    session = PooledSession()
    monkeypatch.setattr(local_provider, "_load_session", lambda path: session)
    embedder = LocalEmbedder(copy_bundled_model(tmp_path / "pooled", hidden_size=2))

    vectors = embedder.embed(["four words right here", "hi"])

    # [CLS] four words right here [SEP] is 6 tokens, so (6, 3) normalised.
    np.testing.assert_allclose(vectors[0], np.array([6.0, 3.0]) / np.hypot(6, 3), atol=1e-6)
    np.testing.assert_allclose(vectors[1], np.array([3.0, 3.0]) / np.hypot(3, 3), atol=1e-6)
    assert {name: array.dtype for name, array in session.feeds[-1].items()} == {
        "input_ids": np.int32,
        "attention_mask": np.int32,
    }


# Settings and the singleton ------------------------------------------------------


def test_it_builds_one_embedder_per_process_without_loading_it():
    with ThreadPoolExecutor(max_workers=8) as pool:
        built = set(pool.map(lambda _: id(embeddings.get_embedder()), range(32)))

    assert len(built) == 1
    assert embeddings.model_spec() == ("all-MiniLM-L6-v2", 384)
    assert not embeddings.get_embedder().is_loaded


def test_it_builds_a_new_embedder_after_a_reset():
    first = embeddings.get_embedder()

    embeddings.reset_embedder()

    assert embeddings.get_embedder() is not first


def test_it_rebuilds_when_embedding_settings_change(settings):
    first = embeddings.get_embedder()

    settings.EMBEDDING_BATCH_SIZE = 7

    assert embeddings.get_embedder() is not first
    assert embeddings.get_embedder().batch_size == 7


def test_it_defaults_the_threshold_per_provider(settings):
    settings.RECALL_DEFAULT_THRESHOLD = None
    assert embeddings.get_embedder().default_threshold == embeddings.LOCAL_THRESHOLD

    settings.EMBEDDING_PROVIDER = "openai"
    settings.OPENAI_API_KEY = API_KEY
    assert embeddings.get_embedder().default_threshold == 0.7


def test_recall_default_threshold_sets_the_scores_default_not_the_models(settings):
    # Since issue 22 the threshold is on score; the model keeps its own
    # similarity threshold, which the score reads similarity against.
    settings.RECALL_DEFAULT_THRESHOLD = 0.55
    assert search.default_threshold() == 0.55
    assert embeddings.get_embedder().default_threshold == embeddings.LOCAL_THRESHOLD

    settings.EMBEDDING_PROVIDER = "openai"
    settings.OPENAI_API_KEY = API_KEY
    assert search.default_threshold() == 0.55
    assert embeddings.get_embedder().default_threshold == 0.7


def test_it_refuses_to_start_in_production_with_openai_and_no_key(tmp_path):
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("OPENAI_", "EMBEDDING_", "DJANGO_", "RECALL_", "DATABASE_"))
    }
    environment.update(
        DEBUG="false",
        EMBEDDING_PROVIDER="openai",
        RECALL_DATA_DIR=str(tmp_path),
        SECRET_KEY="s" * 50,
        API_KEY_SECRET="k" * 50,
    )

    def import_settings(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "import recall.settings"],
            cwd=ROOT,
            env={**environment, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = import_settings()
    accepted = import_settings(OPENAI_API_KEY=API_KEY)

    assert refused.returncode != 0
    assert "ImproperlyConfigured" in refused.stderr
    assert "OPENAI_API_KEY" in refused.stderr
    assert accepted.returncode == 0, accepted.stderr


@pytest.fixture
def api() -> Iterator[FakeOpenAI]:
    with serving() as state:
        yield state


def client(api: FakeOpenAI, **options: Any) -> OpenAIEmbedder:
    options = {"api_key": API_KEY, "base_url": api.url, "max_retries": 2, **options}
    return OpenAIEmbedder(**options)


def test_it_returns_openai_vectors_normalised_and_in_input_order(api):
    texts = ["first memory", "second memory", "third memory"]

    vectors = client(api).embed(texts)

    expected = np.stack([unit(fake_vector(text, 1536)) for text in texts])
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    assert vectors.dtype == np.float32
    (request,) = api.requests
    assert request["path"] == "/v1/embeddings"
    assert request["authorization"] == f"Bearer {API_KEY}"
    assert request["body"]["model"] == "text-embedding-3-small"
    assert request["body"]["input"] == texts
    assert "dimensions" not in request["body"]


def test_it_reads_float_answers_to_a_base64_request(api):
    api.always_float = True

    vector = client(api).embed_one("a memory")

    assert api.requests[0]["body"]["encoding_format"] == "base64"
    np.testing.assert_allclose(vector, unit(fake_vector("a memory", 1536)), atol=1e-6)


def test_it_sends_dimensions_only_when_configured_for_a_text_embedding_3_model(api):
    api.width = 256
    shortened = client(api, dimensions=256)

    shortened.embed_one("a memory")

    assert api.requests[-1]["body"]["dimensions"] == 256
    assert (shortened.model_id, shortened.dimensions) == ("text-embedding-3-small:256", 256)

    declared = client(api, model="nomic-embed-text", dimensions=256)
    declared.embed_one("a memory")

    assert "dimensions" not in api.requests[-1]["body"]
    assert (declared.model_id, declared.dimensions) == ("nomic-embed-text", 256)


def test_it_batches_requests_by_embedding_batch_size(api):
    texts = [f"memory {i}" for i in range(8)]

    vectors = client(api, batch_size=3).embed(texts)

    assert [request["body"]["input"] for request in api.requests] == [
        texts[0:3],
        texts[3:6],
        texts[6:8],
    ]
    np.testing.assert_allclose(vectors[7], unit(fake_vector("memory 7", 1536)), atol=1e-6)
    assert client(api, batch_size=5000).batch_size == 2048


def test_it_retries_after_a_server_error(api):
    api.script = [Reply(500, body={"error": {"message": "boom"}})]

    vector = client(api).embed_one("a memory")

    assert len(api.requests) == 2
    np.testing.assert_allclose(vector, unit(fake_vector("a memory", 1536)), atol=1e-6)


def test_it_waits_as_long_as_retry_after_asks_on_a_429(api):
    api.script = [Reply(429, headers={"Retry-After": "1"}, body={"error": {"message": "slow"}})]

    client(api).embed_one("a memory")

    first, second = api.requests
    # The SDK's own backoff for a first retry is at most 0.5 s.
    assert second["at"] - first["at"] >= 0.95


def test_it_gives_up_after_openai_max_retries(api):
    api.script = [Reply(503, body={"error": {"message": "down"}})] * 5

    with pytest.raises(EmbeddingUnavailable, match="HTTP 503"):
        client(api, max_retries=1).embed_one("a memory")

    assert len(api.requests) == 2


def test_it_turns_a_timeout_into_embedding_unavailable(api):
    api.script = [Reply(delay=3.0)]
    started = time.monotonic()

    with pytest.raises(EmbeddingUnavailable, match=r"did not answer within 0\.3 seconds"):
        client(api, timeout=0.3, max_retries=0).embed_one("a memory")

    assert time.monotonic() - started < 2.0


def test_an_answer_sent_a_few_bytes_at_a_time_still_ends_at_the_timeout(api):
    # Each read came sooner than the timeout, so the SDK's own timeout never
    # fired: the call lasted as long as the server kept sending.
    api.script = [Reply(trickle=0.1)]
    started = time.monotonic()

    with pytest.raises(EmbeddingUnavailable, match=r"did not answer within 0\.5 seconds"):
        client(api, timeout=0.5, max_retries=0).embed_one("a memory")

    assert time.monotonic() - started < 5.0


def test_a_proxy_named_in_the_environment_still_carries_the_requests(api, monkeypatch):
    # The client that bounds each answer in time must keep what the SDK's own
    # did: HTTP(S)_PROXY from the environment, for servers reached through one.
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", api.url.removesuffix("/v1"))

    vector = client(api, base_url="http://embeddings.invalid/v1").embed_one("a memory")

    assert vector.shape == (1536,)
    assert api.requests[-1]["path"] == "http://embeddings.invalid/v1/embeddings"


def test_it_refuses_vectors_of_the_wrong_width(api):
    api.width = 768

    with pytest.raises(EmbeddingUnavailable, match=r"768-dimensional .* expected 1536"):
        client(api).embed_one("a memory")


def test_a_vector_too_long_for_float32_to_measure_is_still_its_direction(api):
    # 1e20 in every one of 1536 places: each value fits float32, its length does not.
    # Dividing by that infinity stored a zero vector, which ranked first for every query.
    plain = client(api).embed_one("a memory")
    api.scale = 1e20 / float(np.abs(fake_vector("a memory", api.width)).max())

    scaled = client(api).embed_one("a memory")

    assert np.isclose(np.linalg.norm(scaled), 1.0, atol=1e-5)
    assert np.allclose(scaled, plain, atol=1e-6)


def test_it_refuses_an_answer_with_missing_vectors(api):
    api.short_by_one = True

    with pytest.raises(EmbeddingUnavailable, match="2 vectors for 3 inputs"):
        client(api).embed(["a", "b", "c"])


def test_it_does_not_retry_a_rejected_key(api):
    api.script = [Reply(401, body={"error": {"message": f"Incorrect API key provided: {API_KEY}"}})]

    with pytest.raises(EmbeddingUnavailable, match="OPENAI_API_KEY"):
        client(api, max_retries=3).embed_one("a memory")

    assert len(api.requests) == 1


@pytest.mark.parametrize(
    "reply",
    [
        Reply(401, body={"error": {"message": f"Incorrect API key {API_KEY}: {SECRET_TEXT}"}}),
        Reply(400, body={"error": {"message": f"Bad input {SECRET_TEXT} with key {API_KEY}"}}),
        Reply(500, body={"error": {"message": f"{SECRET_TEXT} {API_KEY}"}}),
        Reply(200, body={"unexpected": f"{SECRET_TEXT} {API_KEY}"}),
    ],
    ids=["401", "400", "500", "malformed"],
)
def test_it_never_puts_the_key_or_the_text_in_its_errors(api, reply):
    api.script = [reply] * 3

    with pytest.raises(EmbeddingUnavailable) as caught:
        client(api, max_retries=0).embed_one(SECRET_TEXT)

    error = caught.value
    shown = " ".join([str(error), repr(error), json.dumps(error.as_dict())])
    assert API_KEY not in shown
    assert SECRET_TEXT not in shown
    # Nothing from the SDK rides along to a traceback in the logs either.
    assert error.__cause__ is None
    assert error.__context__ is None
    assert API_KEY not in repr(client(api))


def test_it_knows_openai_widths_without_calling_the_api(api, settings):
    settings.EMBEDDING_PROVIDER = "openai"
    settings.OPENAI_API_KEY = API_KEY
    settings.OPENAI_BASE_URL = api.url
    settings.OPENAI_EMBEDDING_MODEL = "text-embedding-3-large"

    assert embeddings.model_spec() == ("text-embedding-3-large", 3072)
    settings.OPENAI_EMBEDDING_DIMENSIONS = 1024
    assert embeddings.model_spec() == ("text-embedding-3-large:1024", 1024)
    assert api.requests == []


def test_it_probes_an_unknown_model_once_for_its_width(api, settings):
    api.width = 768
    settings.EMBEDDING_PROVIDER = "openai"
    settings.OPENAI_API_KEY = API_KEY
    settings.OPENAI_BASE_URL = api.url
    settings.OPENAI_EMBEDDING_MODEL = "nomic-embed-text"

    assert embeddings.model_spec() == ("nomic-embed-text", 768)
    assert embeddings.model_spec() == ("nomic-embed-text", 768)
    embeddings.get_embedder().embed_one("a memory")

    assert len(api.requests) == 2

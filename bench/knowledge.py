"""Knowledge updates: when a fact changes, does recall put the current one first?

    python bench/knowledge.py --json knowledge.json              # dev and test, over MCP
    python bench/knowledge.py --data DIR --json knowledge.json   # also: is it quiet on LoCoMo?
    python bench/knowledge.py --calibrate                        # refit the detector on dev
    python bench/knowledge.py --smoke                            # seconds, a slice of dev

The data is ``bench/data/knowledge_updates/`` (see ``bench/knowledge_set.py``):
chains of a fact and its replacements, look-alike pairs that are both true,
and distractors, split into a dev part (to calibrate on) and a held-out test
part (to report on). Four measurements:

1. **Over MCP.** The script starts ``python -m recall serve`` on a throwaway
   data directory (as ``bench/http.py`` does), and with the mcp SDK's client
   over Streamable HTTP stores each split's memories in order in one
   namespace, then asks every question with ``recall`` (limit 10). Before
   each ``remember`` it also runs ``recall`` with the new memory's text,
   which gives the candidates the write path would see. Two rows:

   - ``server``: what the server returns. A memory is marked when it
     carries ``superseded_by`` (a link) or ``may_be_replaced_by`` (a newer
     result likely restates it; not linked). The row also counts those
     read marks and how many name a later version of the marked fact.
   - ``server, links only``: the same answers with links alone marked, as a
     client that ignores ``may_be_replaced_by`` reads them.
   - ``server+detector``: the same results with the offline detector
     (``memories.supersession``) run on each write's candidates client-side,
     as the write path will, and the memories it replaced left out (the
     read-side rule of docs/knowledge-updates.md).

   When the server's ``remember`` takes ``replaces`` (phase B), a third row,
   ``explicit``, stores each replacement naming what it replaces.

   When its result names ``may_replace`` (hints), two more rows store the
   split again as an agent that acts on them would, with ``remember(same
   content, replaces=hint)``: ``hints judged right`` links only the hints
   that truly name an earlier version (an agent that never errs: the most
   hints can give), ``hints all taken`` links every hint (an agent that
   never says no: what blind trust costs the look-alikes).

   Figures, per row and split:

   - ``current@1``: chain questions whose first unmarked result is the
     chain's current version;
   - ``stale_unmarked@5``: the share of (question, outdated version) pairs
     where the outdated version is in the top 5, unmarked;
   - ``false_supersession``: look-alike facts marked replaced, or missing
     from their own question's top 5 (``lookalike_missing@5_server``, the
     same without any detector, says how much of it is retrieval alone).

2. **Offline, on the stream** (no server): the detector over each split as
   the write path would run it, each new memory against its 5 nearest
   current memories by cosine: the share of updates found, wrong
   supersessions by kind, and the detector's time per write. Also what the
   writes would name in ``may_replace`` for the caller to judge: how many
   of the updates the detector missed are named, and how many hints are
   true.

3. **Added ``remember`` latency** at ``--latency-size`` (10,000) memories in
   one namespace, in-process on a throwaway database with the embedding
   stubbed out (excluded): ``remember`` alone, and ``remember`` plus what
   detection adds on the write path (the hybrid candidate search with the
   new memory's vector, limit 5, and the decision), call by call in turn.

4. **LoCoMo** (``--data``): the detector over consecutive LoCoMo dev turns,
   each against its 5 nearest earlier turns of the same conversation. Turns
   do not replace each other, so it should stay quiet: the share of turns
   it would mark is reported (the pairs are printed, never written to the
   JSON, whose licence forbids copying the text).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on sys.path, where bench/http.py
# would shadow the standard library's http; the project root goes there instead.
_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import numpy as np  # noqa: E402

from bench import corpus, harness  # noqa: E402
from bench import knowledge_set as ks  # noqa: E402

LIMIT = 10  # results read per question; figures use the top 5 (and the first)
TOP = 5


# Measuring one run's answers ---------------------------------------------------------


@dataclass
class Answer:
    """One question's results: memory keys in order, and which were marked replaced.

    ``restated`` holds the results the server marked ``may_be_replaced_by``
    (key: the marking result's key); they count as marked too.
    """

    question: ks.Question
    keys: list[str]
    marked: set[str] = field(default_factory=set)
    restated: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.marked = self.marked | set(self.restated)

    def visible(self) -> list[str]:
        return [k for k in self.keys if k not in self.marked]


def score(answers: Sequence[Answer], items: Mapping[str, ks.Item] | None = None) -> dict[str, Any]:
    """Return current@1, stale_unmarked@5 and false_supersession over a split's answers.

    With ``items``, also how many ``may_be_replaced_by`` marks there were and
    how many name a later version of the marked memory's own chain.
    """
    chains = [a for a in answers if a.question.role == "chain"]
    looks = [a for a in answers if a.question.role == "lookalike"]
    current = [1.0 if a.visible()[:1] == [a.question.target] else 0.0 for a in chains]
    stale_pairs = [
        1.0 if old in a.keys[:TOP] and old not in a.marked else 0.0
        for a in chains
        for old in a.question.outdated
    ]
    stale_any = [
        1.0 if any(o in a.keys[:TOP] and o not in a.marked for o in a.question.outdated) else 0.0
        for a in chains
    ]
    false = [
        1.0 if a.question.target in a.marked or a.question.target not in a.visible()[:TOP] else 0.0
        for a in looks
    ]
    marked_looks = [1.0 if a.question.target in a.marked else 0.0 for a in looks]
    # What newer first may cost: a look-alike's own fact no longer first.
    looks_first = [1.0 if a.visible()[:1] == [a.question.target] else 0.0 for a in looks]
    current_marked = [1.0 if a.question.target in a.marked else 0.0 for a in chains]
    by_style: dict[str, list[float]] = defaultdict(list)
    for a, hit in zip(chains, current, strict=True):
        by_style[a.question.style].append(hit)

    def mean(values: Sequence[float]) -> float:
        return round(sum(values) / len(values), 4) if values else 0.0

    return {
        "chain_questions": len(chains),
        "current@1": mean(current),
        "current@5": mean([1.0 if a.question.target in a.visible()[:TOP] else 0.0 for a in chains]),
        "stale_unmarked@5": mean(stale_pairs),
        "stale_unmarked@5_any": mean(stale_any),
        "lookalike_questions": len(looks),
        "false_supersession": mean(false),
        "lookalike_marked": mean(marked_looks),
        "lookalike@1": mean(looks_first),
        "current_marked": mean(current_marked),
        "current@1_by_style": {style: mean(v) for style, v in sorted(by_style.items())},
        **(
            {
                "read_marks": sum(len(a.restated) for a in answers),
                "read_marks_true": sum(
                    1
                    for a in answers
                    for key, by in a.restated.items()
                    if key in items and by in items and ks.is_update(items[by], items[key])
                ),
            }
            if items is not None
            else {}
        ),
    }


# Over MCP ---------------------------------------------------------------------------


class ToolFailed(RuntimeError):
    """A tool call the server refused, with its error code."""

    def __init__(self, tool: str, error: Any) -> None:
        super().__init__(f"{tool} failed: {error}")
        self.code = error.get("code") if isinstance(error, dict) else None


class Mcp:
    """One SDK client session on the server's /mcp."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.client: Any = None
        self._stack: Any = None

    async def __aenter__(self) -> Mcp:
        import contextlib

        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        self._stack = contextlib.AsyncExitStack()
        http = await self._stack.enter_async_context(
            httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {self.key}"},
                timeout=httpx2.Timeout(60, read=120),
            )
        )
        self.client = await self._stack.enter_async_context(
            Client(streamable_http_client(self.url, http_client=http), mode="legacy")
        )
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._stack.aclose()

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await self.client.call_tool(tool, arguments)
        data = result.structured_content or {}
        if result.is_error:
            raise ToolFailed(tool, data.get("error") or data)
        return dict(data)

    async def tool_arguments(self, tool: str) -> set[str]:
        tools = (await self.client.list_tools()).tools
        for found in tools:
            if found.name == tool:
                return set((found.input_schema or {}).get("properties", {}))
        return set()


@dataclass
class Stored:
    """A split as stored: memory id by key, and what each write's candidate search found."""

    ids: dict[str, str]
    # Per write, in order: the new memory's key and the recall results before
    # it was stored, [key, similarity, marked by the server] (each key's text
    # is in the split).
    writes: list[tuple[str, list[tuple[str, float, bool]]]]


@dataclass
class Detected:
    """What the offline detector made of a split's writes."""

    replaced: dict[str, str]  # old key -> new key
    # Pairs the detector left open (kept, but ambiguous): (old key, new key).
    ambiguous: list[tuple[str, str]]
    decide_ms: list[float]


# How an agent acts on a write's hints (may_replace): links the true ones
# only, or every one.
HINTS_JUDGED, HINTS_TAKEN = "hints judged right", "hints all taken"


async def store_split(
    mcp: Mcp,
    split: ks.Split,
    namespace: str,
    *,
    search: bool,
    replaces: bool = False,
    hints: str | None = None,
) -> Stored:
    """Store the split's stream; with ``search``, recall each new text first (the candidates).

    With ``hints`` (``HINTS_JUDGED`` or ``HINTS_TAKEN``), act on each
    write's ``may_replace`` as such an agent would.
    """
    ids: dict[str, str] = {}
    keys: dict[str, str] = {}
    by_key = split.by_key
    writes: list[tuple[str, list[tuple[str, float, bool]]]] = []
    for item in split.items:
        if search and ids:
            found = await mcp.call(
                "recall",
                {"query": item.content, "namespace": namespace, "limit": LIMIT, "threshold": 0},
            )
            writes.append(
                (
                    item.key,
                    [
                        (
                            keys[m["id"]],
                            round(float(m["similarity"]), 4),
                            bool(m.get("superseded_by")),
                        )
                        for m in found["memories"]
                    ],
                )
            )
        arguments: dict[str, Any] = {"content": item.content, "namespace": namespace}
        if replaces and item.role == "chain" and item.index > 0:
            arguments["replaces"] = ids[f"chain:{item.group}:{item.index - 1}"]
        try:
            stored = await mcp.call("remember", arguments)
        except ToolFailed as error:
            if error.code != "conflict":
                raise
            # Detection on an earlier write linked the version to something
            # else (a wrong supersession): an agent that knows what it
            # corrects undoes that (restore_memory) and names it again.
            await mcp.call("restore_memory", {"id": arguments["replaces"]})
            stored = await mcp.call("remember", arguments)
        ids[item.key] = stored["id"]
        keys[stored["id"]] = item.key
        for hint in stored.get("may_replace", []) if hints else []:
            if hints == HINTS_JUDGED and not ks.is_update(item, by_key[keys[hint["id"]]]):
                continue
            try:
                await mcp.call("remember", {**arguments, "replaces": hint["id"]})
            except ToolFailed as error:
                if error.code != "conflict":  # replaced meanwhile: nothing to link
                    raise
    return Stored(ids, writes)


def detect(split: ks.Split, writes: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> Detected:
    """Run the offline detector on each write's 5 best current candidates, in order."""
    from memories.supersession import Candidate, decide

    replaced: dict[str, str] = {}
    ambiguous: list[tuple[str, str]] = []
    times: list[float] = []
    by_key = {item.key: item.content for item in split.items}
    for new_key, found in writes:
        current = [f for f in found if f[0] not in replaced and not f[2]][:TOP]
        candidates = [Candidate(key, by_key[key], similarity) for key, similarity, _ in current]
        text = by_key.get(new_key)
        if text is None:
            continue
        started = time.perf_counter()
        decisions = decide(text, candidates)
        times.append((time.perf_counter() - started) * 1000.0)
        for decision in decisions:
            if decision.verdict == "supersede":
                replaced[decision.id] = new_key
            elif decision.ambiguous:
                ambiguous.append((decision.id, new_key))
    return Detected(replaced, ambiguous, times)


def newer_first(order: list[str], pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Move the newer of each ambiguous pair just above the older, when both are listed."""
    out = list(order)
    for old, new in pairs:
        if old in out and new in out and out.index(old) < out.index(new):
            out.remove(new)
            out.insert(out.index(old), new)
    return out


async def ask(
    mcp: Mcp, split: ks.Split, namespace: str, stored: Stored
) -> list[tuple[list[str], list[str], list[list[str]]]]:
    """Ask every question; return each one's result keys, those the server marked replaced,
    and those it marked ``may_be_replaced_by`` ([key, the newer result's key])."""
    keys = {memory_id: key for key, memory_id in stored.ids.items()}
    out = []
    for question in split.questions:
        found = await mcp.call(
            "recall", {"query": question.text, "namespace": namespace, "limit": LIMIT}
        )
        order = [keys.get(m["id"], "?") for m in found["memories"]]
        marked = [
            keys.get(m["id"], "?")
            for m in found["memories"]
            if m.get("superseded_by") or m.get("superseded_at")
        ]
        restated = [
            [keys.get(m["id"], "?"), keys.get(m["may_be_replaced_by"], "?")]
            for m in found["memories"]
            if m.get("may_be_replaced_by")
        ]
        out.append((order, marked, restated))
    return out


def rows_for(
    split: ks.Split,
    answers: Sequence[Sequence[Any]],
    writes: Sequence[tuple[str, Sequence[Sequence[Any]]]],
) -> dict[str, Any]:
    """Score a split's answers as the server marked them, and with the detector's marks.

    ``server`` counts both of the server's marks; ``server, links only`` the
    links alone (``superseded_by``), as a client that ignores
    ``may_be_replaced_by`` reads them. An answer saved before the server
    marked ``may_be_replaced_by`` has no third element.
    """
    found = detect(split, writes)
    items = {item.key: item for item in split.items}
    server, links, detector, ordered = [], [], [], []
    for question, (order, marked, *more) in zip(split.questions, answers, strict=True):
        restated = {key: by for key, by in (more[0] if more else [])}
        server.append(Answer(question, list(order), set(marked), restated))
        links.append(Answer(question, list(order), set(marked)))
        hidden = set(marked) | set(found.replaced)
        detector.append(Answer(question, list(order), hidden))
        ordered.append(Answer(question, newer_first(list(order), found.ambiguous), hidden))
    rows: dict[str, Any] = {
        "server": score(server, items),
        "server, links only": score(links),
        "server+detector": score(detector),
        "server+detector+newer_first": score(ordered),
    }
    rows["server+detector"]["replaced"] = len(found.replaced)
    rows["server+detector"]["decide_ms"] = harness.percentiles(found.decide_ms)
    rows["server+detector+newer_first"]["ambiguous_pairs"] = len(found.ambiguous)
    return rows


async def over_mcp(url: str, key: str, splits: list[ks.Split]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with Mcp(url, key) as mcp:
        explicit = "replaces" in await mcp.tool_arguments("remember")
        out["server_takes_replaces"] = explicit
        for split in splits:
            started = time.monotonic()
            namespace = f"ku-{split.name}"
            stored = await store_split(mcp, split, namespace, search=True)
            answers = await ask(mcp, split, namespace, stored)
            rows = rows_for(split, answers, stored.writes)
            if explicit:
                named = f"ku-{split.name}-explicit"
                named_store = await store_split(mcp, split, named, search=False, replaces=True)
                named_answers = await ask(mcp, split, named, named_store)
                rows["explicit"] = rows_for(split, named_answers, [])["server"]
                for follow in (HINTS_JUDGED, HINTS_TAKEN):
                    place = f"ku-{split.name}-{follow.split()[1]}"
                    followed = await store_split(mcp, split, place, search=False, hints=follow)
                    rows[follow] = rows_for(split, await ask(mcp, split, place, followed), [])[
                        "server"
                    ]
            rows["seconds"] = round(time.monotonic() - started, 1)
            # What the rows were computed from, for --replay with another detector.
            rows["raw"] = {"writes": stored.writes, "answers": answers}
            out[split.name] = rows
            print(f"  {split.name}: {len(split.items)} memories stored and asked", flush=True)
    return out


def raw_path(path: Path) -> Path:
    """Where a report's raw results go: beside it, compact (``x.json``: ``x.raw.json``)."""
    return path.with_name(f"{path.stem}.raw.json")


def replay(path: Path, splits: list[ks.Split]) -> dict[str, Any]:
    """Re-score a saved run's raw results with the detector as it is now (no server)."""
    saved = json.loads(path.read_text())
    out: dict[str, Any] = {"replayed": path.name}
    for split in splits:
        raw = saved[split.name]
        rows = rows_for(split, raw["answers"], raw["writes"])
        rows["raw"] = raw
        out[split.name] = rows
    return out


def run_server(splits: list[ks.Split]) -> dict[str, Any]:
    from bench import http as bench_http

    server = bench_http.Server({}, pg_stats=False)
    print(f"starting python -m recall serve on port {server.port} ...", flush=True)
    try:
        server.start()
        key = server.pro_key()
        return asyncio.run(over_mcp(server.mcp_url, key, splits))
    finally:
        server.stop()
        server.cleanup()


# Offline -----------------------------------------------------------------------------


def local_embedder(cache_dir: Path | None) -> tuple[Any, corpus.EmbeddingCache]:
    from memories.embeddings.local import BUNDLED_ONNX_SHA256, LocalEmbedder

    model = LocalEmbedder()
    model.load()
    cache = corpus.EmbeddingCache(cache_dir, f"{model.model_id}-{BUNDLED_ONNX_SHA256[:12]}")
    return model, cache


def vectors_for(model: Any, cache: corpus.EmbeddingCache, texts: list[str]) -> dict[str, Any]:
    unique = list(dict.fromkeys(texts))
    return dict(zip(unique, corpus.embed_texts(model, unique, cache), strict=True))


def offline(split: ks.Split, vectors: dict[str, Any]) -> dict[str, Any]:
    from memories.supersession import decide

    times: list[float] = []

    def timed(new: str, candidates: Sequence[Any]) -> list[Any]:
        started = time.perf_counter()
        out = decide(new, candidates)
        times.append((time.perf_counter() - started) * 1000.0)
        return out

    simulation = ks.simulate(split, vectors, timed)
    summary = simulation.summary(split)
    summary["decide_ms"] = harness.percentiles(times)
    return summary


def locomo_quiet(data: Path, model: Any, cache: corpus.EmbeddingCache) -> dict[str, Any]:
    """Run the detector over each LoCoMo conversation's turns, each against its nearest."""
    from bench.retrieval import locomo_file
    from memories import validation
    from memories.supersession import Candidate, decide, hints

    raw = json.loads(locomo_file(data).read_text())
    conversations = corpus.parse_locomo(raw)
    turns = fired = hinted = 0
    examples: list[tuple[str, str, str]] = []
    for conversation in conversations:
        texts = [validation.normalize(t.content) for t in conversation.turns]
        vectors = corpus.embed_texts(model, texts, cache, progress="embedding")
        for n in range(1, len(texts)):
            sims = vectors[:n] @ vectors[n]
            near = np.argsort(-sims)[: ks.CANDIDATES]
            candidates = [Candidate(str(i), texts[i], float(sims[i])) for i in near]
            turns += 1
            decisions = decide(texts[n], candidates)
            hinted += bool(hints(decisions))
            for decision in decisions:
                if decision.verdict == "supersede":
                    fired += 1
                    if len(examples) < 10:
                        examples.append((texts[n], texts[int(decision.id)], decision.reason))
    cache.save()
    for new, old, why in examples:
        print(f"  fired: {new[:90]!r}\n    over {old[:90]!r}\n    ({why})")
    return {
        "file": locomo_file(data).name,
        "conversations": len(conversations),
        "turns": turns,
        "supersessions": fired,
        "rate": round(fired / turns, 4) if turns else 0.0,
        "turns_with_hints": hinted,
    }


def calibrate(split: ks.Split, vectors: dict[str, Any]) -> dict[str, Any]:
    """Fit the score's weights on ``split`` (dev): logistic regression over the scored pairs.

    The pairs are each memory against its 5 nearest earlier ones, as on the
    write path, that no hard rule decides and that show some evidence (a
    changed value, a change word or a negation): exactly those the score
    judges. A ridge keeps the weights small (the intercept is free).
    """
    from memories.supersession import decide as decide_module
    from memories.supersession.text import read

    module = sys.modules["memories.supersession.decide"]
    del decide_module
    names = list(module.WEIGHTS)
    rows, labels = [], []
    for n, new in enumerate(split.items[1:], start=1):
        earlier = split.items[:n]
        sims = np.stack([vectors[i.content] for i in earlier]) @ vectors[new.content]
        for j in np.argsort(-sims)[: ks.CANDIDATES]:
            old = earlier[int(j)]
            a, b = read(old.content), read(new.content)
            evidence = module.compare(a, b, float(sims[j]))
            if module._hard_keep(a, b, evidence) is not None:
                continue
            if not (evidence.changed or evidence.change_words or evidence.negation_flip):
                continue
            features = evidence.features()
            rows.append([features[name] for name in names])
            labels.append(1.0 if ks.is_update(new, old) else 0.0)
    x, y = np.array(rows), np.array(labels)
    weights = np.zeros(len(names))
    ridge = np.diag([0.0 if name == "bias" else 0.5 for name in names])
    for _ in range(100):  # Newton's method
        p = 1.0 / (1.0 + np.exp(-x @ weights))
        gradient = x.T @ (p - y) + ridge @ weights
        hessian = x.T @ (x * (p * (1 - p))[:, None]) + ridge + 1e-9 * np.eye(len(names))
        step = np.linalg.solve(hessian, gradient)
        weights -= step
        if np.abs(step).max() < 1e-9:
            break
    p = 1.0 / (1.0 + np.exp(-x @ weights))
    table = []
    for threshold in (0.4, 0.5, 0.6, 0.7, 0.8):
        chosen = p >= threshold
        table.append(
            {
                "threshold": threshold,
                "true": int((chosen & (y == 1)).sum()),
                "false": int((chosen & (y == 0)).sum()),
            }
        )
    return {
        "pairs": len(y),
        "updates_among_them": int(y.sum()),
        "weights": {name: round(float(w), 2) for name, w in zip(names, weights, strict=True)},
        "shipped": dict(module.WEIGHTS),
        "shipped_threshold": module.THRESHOLD,
        "by_threshold": table,
    }


# Latency -------------------------------------------------------------------------------

# Calls in turn: remember with RECALL_SUPERSESSION off, and on (offline).
KINDS = ("off", "offline")


def latency(size: int, calls: int, split: ks.Split) -> dict[str, Any]:
    """Time ``remember`` with detection off and on (``RECALL_SUPERSESSION``), in turns.

    At ``size`` memories in one namespace, embedding stubbed (excluded). The
    calls store the knowledge set's sentences, so the detector reads real
    facts; the filler is synthetic sentences.
    """
    harness.configure()
    from django.conf import settings

    from accounts.models import User
    from core import tenancy
    from memories import embeddings, services
    from memories.services import superseding

    real = embeddings.get_embedder()
    rng = np.random.default_rng(22)
    pool = rng.standard_normal((4096, int(real.dimensions))).astype(np.float32)
    pool /= np.linalg.norm(pool, axis=1, keepdims=True)
    stub = harness.stub_embedder(real, {}, pool)
    from bench.http import synthetic_sentences

    texts = [i.content for i in split.items]
    filler = synthetic_sentences(size)
    user = User.objects.create_user(f"bench-knowledge-{time.time_ns()}@example.com")
    namespace = "ku-latency"
    started = time.monotonic()
    chosen = settings.RECALL_SUPERSESSION
    timings: dict[str, list[float]] = defaultdict(list)
    linked = 0
    # Where detection's time goes: its candidate statement and its decision.
    originals = (superseding.nearest, superseding.decide, superseding.detect)

    def timed(name: str, function: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                timings[name].append((time.perf_counter() - t0) * 1000.0)

        return run

    superseding.nearest = timed("candidates", superseding.nearest)
    superseding.decide = timed("decide", superseding.decide)
    superseding.detect = timed("detect", superseding.detect)
    try:
        with harness.using_embedder(stub):
            settings.RECALL_SUPERSESSION = "off"
            for n, text in enumerate(filler[: size - calls]):
                services.remember(user_id=user.id, tier="pro", content=text, namespace=namespace)
                if n and n % 2000 == 0:
                    print(f"  latency: stored {n:,}/{size:,}", flush=True)
            for n in range(calls):
                kind = KINDS[n % len(KINDS)]
                settings.RECALL_SUPERSESSION = kind
                text = f"{texts[n % len(texts)]} (call {n})"
                t0 = time.perf_counter()
                done = services.remember(
                    user_id=user.id, tier="pro", content=text, namespace=namespace
                )
                timings[kind].append((time.perf_counter() - t0) * 1000.0)
                linked += len(done.get("replaces", []))
    finally:
        superseding.nearest, superseding.decide, superseding.detect = originals
        settings.RECALL_SUPERSESSION = chosen
        from django.db import connection

        with tenancy.operator():
            User.objects.filter(id=user.id).delete()
        connection.close()
    return {
        "memories": size,
        "calls": calls,
        "remember_ms": harness.percentiles(timings["off"]),
        "with_detection_ms": harness.percentiles(timings["offline"]),
        "added_p50_ms": round(
            statistics.median(timings["offline"]) - statistics.median(timings["off"]), 3
        ),
        "candidates_ms": harness.percentiles(timings["candidates"]),
        "decide_ms": harness.percentiles(timings["decide"]),
        "detect_ms": harness.percentiles(timings["detect"]),
        "linked": linked,
        "fill_seconds": round(time.monotonic() - started, 1),
        "note": "embedding stubbed (excluded); RECALL_SUPERSESSION off and offline in turns",
    }


# Output -----------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    mcp = report.get("mcp", {})
    rows = []
    for split in ks.SPLITS:
        for name, figures in mcp.get(split, {}).items():
            if not isinstance(figures, dict) or name == "raw":
                continue
            rows.append(
                [
                    split,
                    name,
                    figures["chain_questions"],
                    figures["current@1"],
                    figures["stale_unmarked@5"],
                    figures["lookalike_questions"],
                    figures["false_supersession"],
                    figures["lookalike_marked"],
                    figures.get("lookalike@1", ""),
                ]
            )
    marks = [
        [split, name, figures["read_marks"], figures["read_marks_true"]]
        for split in ks.SPLITS
        for name, figures in mcp.get(split, {}).items()
        if isinstance(figures, dict) and "read_marks" in figures
    ]
    if rows:
        print("\nOver MCP (recall, limit 10)")
        harness.print_table(
            rows,
            [
                "split",
                "row",
                "chains q",
                "current@1",
                "stale@5",
                "look q",
                "false",
                "marked",
                "look@1",
            ],
        )
    if marks:
        print("\nmay_be_replaced_by in the answers")
        harness.print_table(marks, ["split", "row", "marks", "a later version"])
    rows = [
        [
            name,
            o["updates"],
            o["update_recall"],
            o["wrong"],
            o["lookalike_false_rate"],
            o["currents_marked"],
            o["decide_ms"].get("p50", 0.0),
        ]
        for name, o in report.get("offline", {}).items()
    ]
    if rows:
        print("\nOffline detector over the stream (5 nearest by cosine)")
        harness.print_table(
            rows, ["split", "updates", "found", "wrong", "look-alikes marked", "currents", "ms p50"]
        )
        hinted = [
            [
                name,
                o["updates_missed"],
                o["updates_missed_hinted"],
                o["hints"],
                o["hints_true"],
                f"{o['hint_writes']}/{o['writes']}",
            ]
            for name, o in report["offline"].items()
        ]
        print("\nHints (may_replace): what the writes name for the caller to judge")
        harness.print_table(
            hinted, ["split", "updates missed", "of them named", "hints", "true", "writes with"]
        )
    lat = report.get("latency")
    if lat:
        print(
            f"\nremember at {lat['memories']:,} memories (embedding excluded): p50 "
            f"{lat['remember_ms']['p50']} ms with detection off, "
            f"{lat['with_detection_ms']['p50']} ms on (+{lat['added_p50_ms']} ms: candidates "
            f"p50 {lat['candidates_ms']['p50']} ms, decision {lat['decide_ms']['p50']} ms, "
            f"detection in all {lat['detect_ms']['p50']} ms); "
            f"{lat['linked']} replacements linked"
        )
    quiet = report.get("locomo")
    if quiet:
        print(
            f"\nLoCoMo ({quiet['file']}): the detector fired on {quiet['supersessions']} of "
            f"{quiet['turns']} turns ({quiet['rate']:.2%}); "
            f"{quiet['turns_with_hints']} turns named a hint"
        )
    fit = report.get("calibration")
    if fit:
        print(
            f"\nCalibration on dev: {fit['pairs']} scored pairs, "
            f"{fit['updates_among_them']} updates"
        )
        print(f"  fitted weights:  {fit['weights']}")
        print(f"  shipped weights: {fit['shipped']} (threshold {fit['shipped_threshold']})")
        for row in fit["by_threshold"]:
            print(f"  threshold {row['threshold']}: {row['true']} updates, {row['false']} false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Knowledge updates: current@1, stale facts shown, false supersession.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--smoke", action="store_true", help="A slice of dev, small sizes.")
    parser.add_argument(
        "--splits", default="dev,dev2,test", help="Comma-separated: dev, dev2, test."
    )
    parser.add_argument("--data", type=Path, help="Folder with LoCoMo: check it stays quiet.")
    parser.add_argument("--calibrate", action="store_true", help="Refit the weights on dev.")
    parser.add_argument("--no-server", action="store_true", help="Skip the MCP measurement.")
    parser.add_argument(
        "--replay",
        type=Path,
        help="Instead of a server, re-score the raw results an earlier --json OUT saved "
        "beside it (OUT's name with .raw.json) with the detector as it is now.",
    )
    parser.add_argument(
        "--latency-size",
        type=int,
        default=10_000,
        help="Memories in the namespace where remember's added latency is measured; 0 skips it.",
    )
    parser.add_argument(
        "--latency-calls", type=int, default=400, help="Calls, taking turns between the kinds."
    )
    parser.add_argument(
        "--cache", type=Path, default=corpus.DEFAULT_CACHE, help="Embedding cache directory."
    )
    parser.add_argument("--json", type=Path, help="Write the results here.")
    args = parser.parse_args(argv)
    # Stopped with SIGTERM, still stop the server and remove its data.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    names = [s.strip() for s in args.splits.split(",") if s.strip()]
    for name in names:
        if name not in ks.SPLITS:
            parser.error(f"unknown split {name!r}")
    splits = [ks.smoke(name) if args.smoke else ks.load(name) for name in names]
    started = time.monotonic()
    report: dict[str, Any] = {
        "command": "python bench/knowledge.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": harness.machine(),
        "sizes": {
            s.name: {
                "chains": len(s.chains),
                "lookalike_pairs": len(s.lookalikes),
                "distractors": len(s.distractors),
                "memories": len(s.items),
                "questions": len(s.questions),
            }
            for s in splits
        },
    }
    model, cache = local_embedder(None if args.smoke else args.cache)
    texts = [t for s in splits for t in ks.texts(s)]
    vectors = vectors_for(model, cache, texts)
    cache.save()
    report["offline"] = {s.name: offline(s, vectors) for s in splits}
    for summary in report["offline"].values():
        for new, old in summary.pop("wrong_pairs"):
            print(f"  offline wrong: {new!r} over {old!r}")
    if args.calibrate:
        dev = next((s for s in splits if s.name == "dev"), None) or ks.load("dev")
        report["calibration"] = calibrate(dev, vectors_for(model, cache, ks.texts(dev)))
    if args.data:
        report["locomo"] = locomo_quiet(args.data, model, cache)
    if args.replay:
        report["mcp"] = replay(args.replay, splits)
    elif not args.no_server:
        report["mcp"] = run_server(splits)
    if args.latency_size:
        size = min(args.latency_size, 300) if args.smoke else args.latency_size
        calls = min(args.latency_calls, 20) if args.smoke else args.latency_calls
        report["latency"] = latency(size, calls, splits[0])
    report["seconds"] = round(time.monotonic() - started, 1)
    print_report(report)
    if args.json:
        # The raw results (what --replay re-scores) go beside the report, compact.
        raw = {
            name: rows.pop("raw")
            for name, rows in report.get("mcp", {}).items()
            if isinstance(rows, dict) and "raw" in rows
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
        if raw:
            raw_path(args.json).write_text(json.dumps(raw, separators=(",", ":")) + "\n")
            print(f"wrote {raw_path(args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Running an import: a reader's stream, validated and stored in batches, with a report.

Each record is validated as ``remember`` validates its input; one that fails
is refused with the reason and the import goes on. Records are stored in
batches of ``BATCH``, each batch in one transaction of the user's tenant
(services.store_imports), so row-level security applies and an interrupted
import leaves whole batches only. A record whose place (namespace, agent,
thread, path and content hash) already holds a live memory is skipped as a
duplicate before anything is embedded: running the same import again stores
nothing new and embeds nothing, which is also how an interrupted import is
resumed. A background job goes one better and saves its position with each
batch (``checkpoint``), so it resumes where it stopped.

Vectors the source stored are reused only when they say they come from the
model configured here, have its width, and agree with it: a sample of them
is compared with our own embeddings of the same texts (``agree``).
Otherwise the content is embedded again, with the embedder's batch API.
"""

from __future__ import annotations

import hashlib
import math
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from django.db import connection

from accounts import tiers
from core import context, tenancy
from core.errors import EmbeddingUnavailable, RecallError, ValidationFailed
from memories import embeddings, services, validation
from memories.importers import (
    FORMATS,
    READERS,
    base,
    generic,
    letta,
    mcp_memory_service,
    mem0,
    openmemory,
)
from memories.importers.sources import Source
from memories.services import quota

BATCH = 256
# Writer threads of the operator's command (BENCHMARKS.md, "Imports").
WRITERS = 2
EXAMPLES = 20  # refusals listed one by one in a report; the rest are counted
SAMPLE = 16  # vectors compared with our own before any is reused
# Cosine similarity a source's vector must reach with ours for the same text.
# The bundled int8 model and sentence-transformers' float32 all-MiniLM-L6-v2
# agree at 0.97-0.99 on short texts; another model's vectors sit near 0.
AGREE_MEDIAN = 0.95
AGREE_MIN = 0.85


@dataclass
class Options:
    format: str
    namespace: str = "default"
    ids: str | None = None  # --ids: where source identities go
    columns: str | None = None  # --map: the generic formats' field mapping
    source_model: str | None = None  # --source-model: who made the stored vectors
    dry_run: bool = False

    def check(self) -> None:
        if self.format not in READERS:
            raise ValidationFailed(f"Unknown format {self.format!r}; one of {', '.join(FORMATS)}.")
        self.namespace = validation.namespace(self.namespace)
        identities = {"mem0": mem0.IDENTITIES, "openmemory": openmemory.IDENTITIES}
        identities["letta"] = letta.IDENTITIES
        if self.ids:
            if self.format not in identities:
                raise ValidationFailed("--ids applies to mem0, openmemory and letta.")
            base.identities(self.ids, identities[self.format], flag="--ids")
        if self.columns:
            if self.format not in ("jsonl", "csv"):
                raise ValidationFailed("--map applies to jsonl and csv.")
            generic.mapping(self.columns)

    def reader_options(self) -> dict[str, Any]:
        return {"ids": self.ids, "columns": self.columns, "source_model": self.source_model}


@dataclass
class Report:
    format: str
    source: str
    dry_run: bool = False
    read: int = 0  # records taken from the source, refused ones included
    imported: int = 0
    duplicates: int = 0
    refused: int = 0
    embedded: int = 0
    reused: int = 0
    # Records past the tier's memory quota: not stored (a dry run: would not be).
    over_quota: int = 0
    # Records for a namespace delete_all_memories emptied after the upload.
    withdrawn: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    vectors: list[str] = field(default_factory=list)  # each decision about stored vectors
    seconds: float = 0.0

    def refuse(self, where: str, reason: str) -> None:
        self.refused += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(f"{where}: {reason}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{key: value for key, value in data.items() if key in known})

    def summary(self) -> str:
        verb = "Would import" if self.dry_run else "Imported"
        quota = ""
        if self.over_quota:
            would = "would be" if self.dry_run else "were"
            quota = f" {self.over_quota:,} {would} past the free tier's memory quota;"
        if self.withdrawn:
            quota += (
                f" {self.withdrawn:,} not stored: their namespace was emptied"
                " (delete_all_memories) after the upload;"
            )
        return (
            f"{verb} {self.imported:,} of {self.read:,} records from {self.source} ({self.format}):"
            f" {self.duplicates:,} skipped as duplicates, {self.refused:,} refused;{quota}"
            f" {self.reused:,} vectors reused, {self.embedded:,} embedded."
        )

    def details(self) -> list[str]:
        lines = [f"  vectors: {decision}" for decision in self.vectors]
        for reason, count in sorted(self.reasons.items(), key=lambda kv: -kv[1]):
            lines.append(f"  refused {count:,}: {reason}")
        lines += [f"    {example}" for example in self.examples]
        return lines


def run_import(
    *,
    user_id: uuid.UUID | str,
    source: Source,
    options: Options,
    tier: str | None = None,
    progress: Callable[[Report], None] | None = None,
    resume: Report | None = None,
    checkpoint: Callable[[Report], None] | None = None,
    writers: int = 1,
    until: float | None = None,
    cleared: Callable[[], Collection[services.Cleared]] | None = None,
    stopping: Callable[[], bool] | None = None,
) -> Report:
    """Import ``source`` for the user; return the report.

    ``tier`` applies that tier's memory quota (None: none, the operator's
    command). ``resume`` is the report a previous run of the same job saved:
    its records are passed over and its counts carried on. ``checkpoint``
    runs inside each batch's transaction with the report as it will be once
    the batch commits. ``until`` (a ``time.monotonic()``) is when a reader
    that could otherwise work without end (an SQLite file's) stops.
    ``cleared`` runs at the start of each batch's transaction and names the
    namespaces whose memories it leaves out (``services.store_imports``).
    ``stopping`` is asked before each batch, a dry run's too: once it says
    so, the import ends there with ``services.Stopping``, its unstored batch
    left for the next run (a background worker stopping with its process).

    This thread reads, validates, looks up duplicates and embeds; writer
    threads store, a batch behind, so that the model and the database work
    at the same time. One writer (the default) keeps the batches in order, so
    a checkpoint never counts a batch that has not committed; the operator's
    command, which keeps no checkpoint, runs ``WRITERS``, for the database's
    work on the index is most of an import's when vectors are reused.
    """
    if checkpoint is not None and writers != 1:
        raise ValueError("a checkpointed import stores its batches in order: one writer")
    options.check()
    started = time.monotonic()
    report = resume or Report(format=options.format, source=source.label)
    report.dry_run = options.dry_run
    spent = report.seconds
    skip = report.read
    importer = _Importer(user_id, options, report, tier, checkpoint, writers, cleared)
    stream = READERS[options.format](source, until=until, **options.reader_options())
    read = 0
    try:
        for item in stream:
            read += 1
            if read <= skip:
                continue
            if isinstance(item, base.Refused):
                importer.refusals.append((item.where, item.reason))
            else:
                importer.add(item, source.label)
            if read % BATCH == 0:
                if stopping is not None and stopping():
                    raise services.Stopping
                importer.flush(read)
                report.seconds = spent + time.monotonic() - started
                if progress is not None:
                    progress(report)
        importer.flush(read)
        importer.finish()
    finally:
        importer.close()
    if options.dry_run and tier is not None:
        _predict_quota(user_id, tier, report)
    report.seconds = spent + time.monotonic() - started
    if progress is not None:
        progress(report)
    return report


def _predict_quota(user_id: uuid.UUID | str, tier: str, report: Report) -> None:
    """Say in a dry run's report how many of what it would import the quota would leave out."""
    # The count the import itself would meet (expired memories not yet
    # purged are not counted), taken as it would take it.
    with tenancy.tenant(user_id):
        left = quota.room(user_id, tier)
    if left is not None:
        report.over_quota = max(0, report.imported - left)
        report.imported -= report.over_quota


@dataclass
class _Batch:
    """What one batch changes in the report, applied once its transaction commits."""

    read: int  # records read up to the end of this batch
    refusals: list[tuple[str, str]]
    items: int
    fresh: list[services.ImportItem]
    # For the first of ``fresh`` only when the quota had no room for the rest.
    vectors: list[np.ndarray]
    reused: int
    decisions: list[str]


class _Importer:
    def __init__(
        self,
        user_id: uuid.UUID | str,
        options: Options,
        report: Report,
        tier: str | None,
        checkpoint: Callable[[Report], None] | None,
        writers: int = 1,
        cleared: Callable[[], Collection[services.Cleared]] | None = None,
    ) -> None:
        self.user_id = user_id
        self.options = options
        self.report = report
        self.tier = tier
        self.checkpoint = checkpoint
        self.cleared = cleared
        self.embedder = embeddings.get_embedder()
        self.batch: list[tuple[services.ImportItem, base.Record, str | None]] = []
        self.refusals: list[tuple[str, str]] = []
        self.decided: list[str] = []
        self.agents: dict[str, uuid.UUID] | None = None
        self.decisions: dict[tuple[str, int], bool] = {}
        self.writers = writers
        self.writer = _Writers(writers)
        self.pending: deque[Future[None]] = deque()
        self.lock = threading.Lock()  # writers settle into one report
        self.flushed = report.read
        # The places this run's earlier batches took: a batch is looked up
        # before the one ahead of it has committed, and 600 copies of one
        # memory were embedded three times. A 12-byte digest each, not the
        # place (a hash of 64 characters, a namespace, a path), to stay small.
        self.taken: set[bytes] = set()

    def add(self, record: base.Record, label: str) -> None:
        try:
            item = self._item(record, label)
        except (ValidationFailed, ValueError) as error:
            reason = error.message if isinstance(error, RecallError) else str(error)
            self.refusals.append((record.where, reason.rstrip(".")))
            return
        self.batch.append((item, record, record.agent))

    def _item(self, record: base.Record, label: str) -> services.ImportItem:
        if not isinstance(record.content, str):
            raise ValueError("no content" if record.content is None else "content is not text")
        content = validation.content(record.content)
        updated = base.moment(record.updated_at, "updated_at")
        # Only when it was last changed: it was written then at the latest.
        created = base.moment(record.created_at, "created_at") or updated
        updated = updated or created
        if created is not None and updated is not None and updated < created:
            raise ValueError("updated_at is before created_at")
        metadata = record.metadata if record.metadata is not None else {}
        if not isinstance(metadata, dict):
            record.extra["metadata"] = metadata
            metadata = {}
        origin = {"format": self.options.format, "file": label}
        if record.source_id is not None:
            origin["id"] = record.source_id
        metadata = base.with_provenance(metadata, origin, record.extra)
        agent = validation.label(record.agent, field="agent", shown=True)
        if agent is not None:
            record.agent = agent
        return services.ImportItem(
            namespace=validation.namespace(record.namespace or self.options.namespace),
            agent_id=None,  # resolved per batch
            thread_id=validation.label(record.thread_id, field="thread_id"),
            kind=record.kind,
            author=validation.label(record.author or None, field="author") or "",
            path=validation.label(record.path or None, field="path", maximum=1024) or "",
            content=content,
            content_hash=validation.content_hash(content),
            metadata=metadata,
            priority=validation.priority(record.priority),
            created_at=created,
            updated_at=updated,
        )

    # one batch ---------------------------------------------------------------

    def flush(self, read: int) -> None:
        batch, self.batch = self.batch, []
        refusals, self.refusals = self.refusals, []
        if read == self.flushed:
            return
        self.flushed = read
        items = self._with_agents(batch) if batch else []
        fresh = services.new_imports(user_id=self.user_id, items=items) if items else []
        fresh = [n for n in fresh if self._first(items[n])]
        if self.options.dry_run:
            self._apply(_Batch(read, refusals, len(items), [items[i] for i in fresh], [], 0, []))
            return
        new = [items[i] for i in fresh]
        room = self._room(len(new))
        vectors, reused = self._vectors([batch[i][1] for i in fresh[:room]], new[:room])
        decisions, self.decided = self.decided, []
        work = _Batch(read, refusals, len(items), new, vectors, reused, decisions)
        while len(self.pending) >= self.writers:
            self._wait()
        # Not the whole context: Django's connection lives in it (asgiref's
        # Local), and the writer needs a connection of its own. Who is acting,
        # for the history rows, is all it takes along.
        who = context.actor.get()
        self.pending.append(self.writer.submit(lambda: self._write(work, who)))

    def _room(self, wanted: int) -> int:
        """How many of a batch's ``wanted`` new memories the tier's quota still has room for.

        Looked up before the batch is embedded, once the batches ahead of it
        have committed: an upload with room for 98 embedded 152 and stored
        98, and its report counted all 152 as embedded. ``store_imports``
        checks again as it stores, under the quota's lock.
        """
        if self.tier is None or tiers.memory_limit(self.tier) is None or not wanted:
            return wanted
        self.finish()  # what they store counts; a batch that met the quota stops the import here
        with tenancy.tenant(self.user_id):
            left = quota.room(self.user_id, self.tier)
        return wanted if left is None else min(wanted, left)

    def _first(self, item: services.ImportItem) -> bool:
        """Return whether no earlier batch of this run took ``item``'s place, and take it."""
        digest = hashlib.blake2b(repr(item.place).encode("utf-8"), digest_size=12).digest()
        if digest in self.taken:
            return False
        self.taken.add(digest)
        return True

    def finish(self) -> None:
        while self.pending:
            self._wait()

    def close(self) -> None:
        self.writer.close()

    def _wait(self) -> None:
        # A failed batch stops the import here, with its error.
        self.pending.popleft().result()

    def _write(self, work: _Batch, who: context.Actor | None) -> None:
        acting = context.acting_as(who.client, who.api_key_id) if who else nullcontext()
        with acting:
            self._store(work)

    def _store(self, work: _Batch) -> None:
        services.store_imports(
            user_id=self.user_id,
            items=work.fresh,
            vectors=work.vectors,
            model_id=self.embedder.model_id,
            tier=self.tier,
            finish=lambda inserted, cut, withdrawn: self._settle(work, inserted, cut, withdrawn),
            cleared=self.cleared,
        )

    def _settle(self, work: _Batch, inserted: int, cut: int, withdrawn: int) -> None:
        with self.lock:
            self._apply(work, inserted, cut, withdrawn)
        if self.checkpoint is not None:
            self.checkpoint(self.report)

    def _apply(
        self, work: _Batch, inserted: int | None = None, cut: int = 0, withdrawn: int = 0
    ) -> None:
        report = self.report
        new = len(work.fresh) if inserted is None else inserted
        report.read = max(report.read, work.read)
        for where, reason in work.refusals:
            report.refuse(where, reason)
        report.imported += new
        report.over_quota += cut
        report.withdrawn += withdrawn
        report.duplicates += work.items - new - cut - withdrawn
        if inserted is not None:
            report.reused += work.reused
            report.embedded += len(work.vectors) - work.reused
        report.vectors += work.decisions

    def _with_agents(
        self, batch: list[tuple[services.ImportItem, base.Record, str | None]]
    ) -> list[services.ImportItem]:
        from accounts import services as accounts

        names: set[str] = {name for _, _, name in batch if name}
        if names and self.agents is None:
            self.agents = {a.name.lower(): a.id for a in accounts.list_agents(user_id=self.user_id)}
        agents = self.agents if self.agents is not None else {}
        for name in sorted(names):
            if name.lower() not in agents and not self.options.dry_run:
                made, _ = accounts.agent_called(user_id=self.user_id, name=name)
                agents[name.lower()] = made.id
        out = []
        for item, _, named in batch:
            agent = agents.get(named.lower()) if named else None
            if named and agent is None:  # a dry run: an agent that does not exist yet
                agent = uuid.uuid5(uuid.NAMESPACE_OID, named.lower())
            out.append(_replace(item, agent_id=agent))
        return out

    # vectors ------------------------------------------------------------------

    def _vectors(
        self, records: list[base.Record], items: list[services.ImportItem]
    ) -> tuple[list[np.ndarray], int]:
        vectors: list[np.ndarray | None] = [None] * len(items)
        for n, record in enumerate(records):
            if record.vector is not None and self._trusted(record, records, items):
                vectors[n] = _unit(record.vector)
        reused = sum(v is not None for v in vectors)
        missing = [n for n, v in enumerate(vectors) if v is None]
        if missing:
            made = _embed(self.embedder, [items[n].content for n in missing])
            for n, vector in zip(missing, made, strict=True):
                vectors[n] = vector
        return [v for v in vectors if v is not None], reused

    def _trusted(
        self, record: base.Record, records: list[base.Record], items: list[services.ImportItem]
    ) -> bool:
        assert record.vector is not None
        model = _model_name(record.vector_model or "")
        width = int(record.vector.shape[0])
        key = (model, width)
        if key not in self.decisions:
            self.decisions[key] = self._decide(model, width, records, items)
        return self.decisions[key]

    def _decide(
        self, model: str, width: int, records: list[base.Record], items: list[services.ImportItem]
    ) -> bool:
        ours = self.embedder.model_id
        said = f"{model or 'an unnamed model'}, {width} dimensions"
        if model.casefold() != _model_name(ours).casefold():
            self.decided.append(f"{said}: not {ours}, embedded again")
            return False
        if width != self.embedder.dimensions:
            self.decided.append(
                f"{said}: {ours} here has {self.embedder.dimensions}, embedded again"
            )
            return False
        sample = [
            (unit, item.content)
            for r, item in zip(records, items, strict=True)
            if r.vector is not None
            and _model_name(r.vector_model or "") == model
            and r.vector.shape[0] == width  # the decision is one model's at one width
            and (unit := _unit(r.vector)) is not None
        ][:SAMPLE]
        if not sample:
            self.decided.append(f"{said}: none is a usable vector, embedded again")
            return False
        theirs = np.stack([v for v, _ in sample])
        mine = _embed(self.embedder, [text for _, text in sample])
        similarity = np.sum(theirs * np.stack(mine), axis=1)
        median, lowest = float(np.median(similarity)), float(np.min(similarity))
        agree = median >= AGREE_MEDIAN and lowest >= AGREE_MIN
        verdict = "reused" if agree else "do not match ours, embedded again"
        self.decided.append(
            f"{said}: a sample of {len(sample)} compared with ours, median similarity"
            f" {median:.3f} (lowest {lowest:.3f}): {verdict}"
        )
        return agree


class _Writers:
    """Threads that store batches, each on one database connection for the whole import.

    A connection per batch cost a new PostgreSQL backend every 256 rows, and
    each new backend compiles the memories triggers' functions and plans
    again before its first insert (BENCHMARKS.md, "Imports"). Each thread
    closes its connection when the import ends, whether it succeeded or not.
    Batches queued behind a failed one are still stored, each in its own
    transaction; the import reports the failure once they are.
    """

    def __init__(self, count: int) -> None:
        self.jobs: queue.SimpleQueue[tuple[Future[None], Callable[[], None]] | None]
        self.jobs = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._serve, name=f"import-writer-{n}", daemon=True)
            for n in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def submit(self, job: Callable[[], None]) -> Future[None]:
        future: Future[None] = Future()
        self.jobs.put((future, job))
        return future

    def close(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            thread.join()

    def _serve(self) -> None:
        try:
            while (taken := self.jobs.get()) is not None:
                future, job = taken
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    job()
                except BaseException as error:  # handed to the thread that waits on it
                    # A batch that failed may have left its connection broken:
                    # the next one on this thread starts on a new one.
                    connection.close()
                    future.set_exception(error)
                else:
                    future.set_result(None)
        finally:
            connection.close()


def _unit(vector: np.ndarray) -> np.ndarray | None:
    """Return ``vector`` scaled to length 1, or None when it has no usable direction.

    In float64: float32 values near its limit (1e38) overflowed the norm to
    inf, and the comparison with ours printed numpy's warning and "median
    similarity nan". Not finite, all zeros, or too large even so: embedded again.
    """
    with np.errstate(all="ignore"):
        wide = np.asarray(vector, dtype=np.float64)
        norm = float(np.linalg.norm(wide)) if np.all(np.isfinite(wide)) else math.inf
    if not math.isfinite(norm) or norm == 0.0:
        return None
    return (wide / norm).astype(np.float32)


def _model_name(name: str) -> str:
    # sentence-transformers' hub names carry the organisation.
    return name.strip().rsplit("/", 1)[-1]


def _embed(embedder: embeddings.Embedder, texts: list[str]) -> list[np.ndarray]:
    try:
        return list(embedder.embed(texts))
    except RecallError:
        raise
    except Exception:
        raise EmbeddingUnavailable(
            "The embedding model could not process this import. Try again shortly."
        ) from None


def _replace(item: services.ImportItem, **changes: Any) -> services.ImportItem:
    from dataclasses import replace

    return replace(item, **changes)


def estimate_total(source: Source, fmt: str) -> int | None:
    """Return how many records ``source`` holds when that is cheap to know, else None."""
    if fmt == "mcp-memory-service":
        return mcp_memory_service.count(source)
    lines = fmt in ("jsonl", "csv") or (fmt == "mem0" and source.suffix in (".jsonl", ".ndjson"))
    if not lines or not source.path.is_file():
        return None
    with source.path.open("rb") as raw:
        count = sum(1 for line in raw if line.strip())
    return max(count - 1, 0) if fmt == "csv" else count

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from memories import embeddings, indexes
from memories.models import Memory
from recall import tenancy


class Command(BaseCommand):
    help = (
        "Re-embed every memory whose vector came from another model, using the configured "
        "embedding model, and build that model's HNSW index. Until a memory is re-embedded, "
        "recall does not find it: searches never mix two models' vectors."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=64, help="Memories per batch.")
        parser.add_argument(
            "--drop-old-indexes",
            action="store_true",
            help="Afterwards, drop the HNSW indexes of models no memory uses any more.",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be re-embedded and stop."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        embedder = embeddings.get_embedder()
        embedder.load()
        model = embedder.model_id
        # DDL runs as the connecting (owner) role, not on the operator path.
        indexes.ensure_vector_index(model, embedder.dimensions)
        with tenancy.operator():
            total = Memory.objects.exclude(embedding_model=model).count()
        if options["dry_run"] or total == 0:
            self.stdout.write(f"{total} memories to re-embed with {model}; nothing changed.")
            return

        done = skipped = 0
        last_id = None
        started = time.monotonic()
        while True:
            with tenancy.operator():
                batch = Memory.objects.exclude(embedding_model=model).order_by("id")
                if last_id is not None:
                    batch = batch.filter(id__gt=last_id)
                rows = list(batch.values("id", "content", "content_hash")[: options["batch_size"]])
            if not rows:
                break
            vectors = embedder.embed([row["content"] for row in rows])
            with tenancy.operator():
                for row, vector in zip(rows, vectors, strict=True):
                    # The hash guard skips a memory whose content changed meanwhile;
                    # its update already embedded it with the current model.
                    changed = (
                        Memory.objects.filter(id=row["id"], content_hash=row["content_hash"])
                        .exclude(embedding_model=model)
                        .update(embedding=vector, embedding_model=model)
                    )
                    done += changed
                    skipped += 1 - changed
            last_id = rows[-1]["id"]
            self._progress(done + skipped, total, started)

        dropped: list[str] = []
        if options["drop_old_indexes"]:
            with tenancy.operator():
                in_use = set(Memory.objects.values_list("embedding_model", flat=True).distinct())
            for old in indexes.existing_models():
                if old not in in_use and old != model:
                    indexes.drop_vector_index(old)
                    dropped.append(old)
        self.stderr.write("")
        summary = f"Re-embedded {done} memories with {model} in {time.monotonic() - started:.1f}s"
        if skipped:
            summary += f"; {skipped} changed meanwhile and were already current"
        if dropped:
            summary += f"; dropped indexes for {', '.join(dropped)}"
        self.stdout.write(summary + ".")

    def _progress(self, seen: int, total: int, started: float) -> None:
        elapsed = max(time.monotonic() - started, 1e-6)
        rate = seen / elapsed
        remaining = max(total - seen, 0) / rate if rate else 0.0
        width = 30
        filled = int(width * min(seen / total, 1.0))
        bar = "#" * filled + "-" * (width - filled)
        self.stderr.write(
            f"\r[{bar}] {seen}/{total} {100 * seen / total:5.1f}%  {rate:,.0f}/s  "
            f"ETA {remaining:,.0f}s",
            ending="",
        )
        self.stderr.flush()

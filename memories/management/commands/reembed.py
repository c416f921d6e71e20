from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from memories import services


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
        result = services.reembed(
            batch_size=options["batch_size"],
            dry_run=options["dry_run"],
            drop_old_indexes=options["drop_old_indexes"],
            progress=self._progress,
        )
        if options["dry_run"] or result.total == 0:
            self.stdout.write(
                f"{result.total} memories to re-embed with {result.model}; nothing changed."
            )
            return
        self.stderr.write("")
        summary = f"Re-embedded {result.done} memories with {result.model} in {result.seconds:.1f}s"
        if result.skipped:
            summary += f"; {result.skipped} changed meanwhile and were already current"
        if result.dropped:
            summary += f"; dropped indexes for {', '.join(result.dropped)}"
        self.stdout.write(summary + ".")

    def _progress(self, seen: int, total: int, elapsed: float) -> None:
        rate = seen / max(elapsed, 1e-6)
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

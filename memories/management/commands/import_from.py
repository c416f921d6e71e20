from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import services as accounts_services
from core import context
from core.errors import RecallError
from memories.importers import FORMATS, Source
from memories.importers.run import WRITERS, Options, Report, estimate_total, run_import


class Command(BaseCommand):
    help = (
        "Import memories from another memory server into a user's account: mem0 or "
        "OpenMemory exports, mcp-memory-service's SQLite-vec database, a basic-memory folder, "
        "a Letta agent file, or any JSON Lines or CSV file with --map. Memories already there "
        "are skipped, so running it again imports nothing new and resumes an interrupted run. "
        "See the README's 'Moving from another memory server'."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="format", required=True, choices=FORMATS)
        parser.add_argument("email", help="Whose account receives the memories.")
        parser.add_argument("path", help="The export file, database or folder.")
        parser.add_argument(
            "--namespace",
            default="default",
            help="Namespace for memories the source does not place.",
        )
        parser.add_argument(
            "--ids",
            help="Where source identities go, e.g. user_id=metadata,run_id=namespace "
            "(mem0), app=namespace (openmemory), agent=metadata (letta).",
        )
        parser.add_argument(
            "--map",
            dest="columns",
            help="jsonl/csv: which source field fills which of ours, e.g. "
            "content=text,created_at=ts,metadata.source=origin.",
        )
        parser.add_argument(
            "--source-model",
            help="The embedding model that made the source's vectors, when it does not say "
            "(mcp-memory-service: all-MiniLM-L6-v2 unless told).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Read and check everything; store nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.latest: Report | None = None
        try:
            self._import(options)
        except KeyboardInterrupt:
            # Ctrl-C: the writers stored the batches handed to them, whole, and
            # nothing after.
            if self.latest is not None:
                self.stderr.write("")  # ends the progress line
            self.stderr.write(self._interrupted(options["dry_run"]))
            raise SystemExit(130) from None

    def _import(self, options: dict[str, Any]) -> None:
        user = accounts_services.find_user(email=options["email"])
        if user is None:
            raise CommandError(f"No user with email {options['email']}.")
        path = Path(options["path"])
        if not path.exists():
            raise CommandError(f"Cannot read {path}: no such file or directory.")
        source = Source.at(path)
        chosen = Options(
            format=options["format"],
            namespace=options["namespace"],
            ids=options["ids"],
            columns=options["columns"],
            source_model=options["source_model"],
            dry_run=options["dry_run"],
        )
        self.total = estimate_total(source, chosen.format)
        self.started = time.monotonic()
        self.tty = sys.stderr.isatty()
        try:
            with context.acting_as("import"):
                report = run_import(
                    user_id=user.id,
                    source=source,
                    options=chosen,
                    progress=self._progress,
                    writers=WRITERS,
                )
        except RecallError as error:
            self.stderr.write("")
            raise CommandError(error.message) from None
        self.stderr.write("")
        self.stdout.write(
            report.summary().replace(" records from ", f" records into {user.email} from ", 1)
        )
        for line in report.details():
            self.stdout.write(line)

    def _interrupted(self, dry_run: bool) -> str:
        if dry_run:
            return "Interrupted: a dry run, so nothing was stored."
        stored = self.latest.imported if self.latest else 0
        return (
            f"Interrupted: {stored:,} memories stored by then stay, whole batches only."
            " Run the same command again to go on: what is already there is skipped."
        )

    def _progress(self, report: Report) -> None:
        self.latest = report
        rate = report.read / max(time.monotonic() - self.started, 1e-6)
        counts = (
            f"imported {report.imported:,}, duplicates {report.duplicates:,},"
            f" refused {report.refused:,} ({rate:,.0f}/s)"
        )
        if self.total:
            share = min(report.read / self.total, 1.0)
            bar = "#" * int(30 * share) + "-" * (30 - int(30 * share))
            line = f"[{bar}] {report.read:,}/{self.total:,} {100 * share:5.1f}%  {counts}"
        else:
            line = f"read {report.read:,}  {counts}"
        # On a terminal the line redraws in place; in a log, one line per update.
        self.stderr.write(f"\r{line}" if self.tty else line, ending="" if self.tty else "\n")
        self.stderr.flush()

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import services as accounts_services
from core import context
from core.errors import RecallError
from memories import services, transfer
from memories.importers import FORMATS


class Command(BaseCommand):
    help = (
        "Import memories from a JSON Lines export (`recall export`) into a user's account, "
        "with their history and timestamps. Identical content already in a namespace is "
        "skipped; memories are embedded again unless the file carries vectors from the "
        "configured model. Use - to read standard input. Another memory server's export "
        f"is read with --from FORMAT ({', '.join(FORMATS)}): see "
        "`recall import --from FORMAT --help`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email", help="Whose account receives the memories.")
        parser.add_argument("file", help="The .jsonl file, or - for standard input.")

    def handle(self, *args: Any, **options: Any) -> None:
        self.latest: services.Imported | None = None
        try:
            self._import(options)
        except KeyboardInterrupt:
            # Ctrl-C: the batches stored stay, with the links among them.
            self._end_line()
            stored = self.latest.imported if self.latest else 0
            self.stderr.write(
                f"Interrupted: {stored:,} memories stored by then stay."
                " Run the same command again to go on: what is already there is skipped."
            )
            raise SystemExit(130) from None

    def _import(self, options: dict[str, Any]) -> None:
        user = accounts_services.find_user(email=options["email"])
        if user is None:
            raise CommandError(f"No user with email {options['email']}.")
        name = options["file"]
        total = None if name == "-" else _count_lines(Path(name))
        self.total = total
        try:
            with contextlib.ExitStack() as stack:
                stream = (
                    sys.stdin
                    if name == "-"
                    # utf-8-sig: a byte order mark some editors write is not content.
                    else stack.enter_context(Path(name).open(encoding="utf-8-sig"))
                )
                with context.acting_as("import"):
                    report = services.import_memories(
                        user_id=user.id,
                        records=transfer.from_lines(stream),
                        progress=self._progress,
                    )
        except OSError as error:
            self._end_line()
            raise CommandError(f"Cannot read {name}: {error.strerror}.") from None
        except RecallError as error:
            self._end_line()
            raise CommandError(error.message) from None
        self._end_line()
        self.stdout.write(
            f"Imported {report.imported:,} of {report.read:,} memories into {user.email}: "
            f"{report.deduplicated:,} already there, {report.expired:,} expired, "
            f"{report.linked:,} replacements linked, {report.already_linked:,} already linked "
            f"({report.unlinked:,} to memories not "
            f"imported, left current; {report.refused:,} not kept: a link to itself, in a "
            "loop, across a namespace, writer or task, of a memory named twice, or of one replaced "
            "already), "
            f"{report.embedded:,} embedded again."
        )

    def _end_line(self) -> None:
        """End the progress line, if one was drawn, so what follows starts a line of its own."""
        if self.latest is not None:
            self.stderr.write("")

    def _progress(self, report: services.Imported) -> None:
        self.latest = report
        if self.total:
            share = min(report.read / self.total, 1.0)
            bar = "#" * int(30 * share) + "-" * (30 - int(30 * share))
            line = f"\r[{bar}] {report.read:,}/{self.total:,} {100 * share:5.1f}%"
        else:
            line = f"\rread {report.read:,}"
        self.stderr.write(f"{line}  imported {report.imported:,}", ending="")
        self.stderr.flush()


def _count_lines(path: Path) -> int | None:
    try:
        with path.open("rb") as raw:
            return sum(1 for line in raw if line.strip())
    except OSError:
        return None

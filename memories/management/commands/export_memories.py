from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import services as accounts_services
from core.errors import RecallError
from memories import services, transfer


class Command(BaseCommand):
    help = (
        "Write a user's memories to standard output as JSON Lines, one memory per line with "
        "its metadata, priority, timestamps and history; for `recall import` or your own tools."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email", help="Whose memories.")
        parser.add_argument("--namespace", help="Only this namespace (default: all of them).")
        parser.add_argument(
            "--embeddings",
            action="store_true",
            help="Include each memory's vector, so an import on the same model skips embedding.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = accounts_services.find_user(email=options["email"])
        if user is None:
            raise CommandError(f"No user with email {options['email']}.")
        count = 0
        try:
            records = services.export_memories(
                user_id=user.id,
                namespace=options["namespace"],
                with_embeddings=options["embeddings"],
            )
            for line in transfer.to_lines(records):
                self.stdout.write(line, ending="")
                count += 1
                if count % 1000 == 0:
                    self.stderr.write(f"\rexported {count:,} memories", ending="")
            self.stdout.flush()
        except RecallError as error:
            raise CommandError(error.message) from None
        except OSError as error:
            # A reader that stopped (`| head`), a full disk: said, not a traceback. What
            # Python would flush at exit goes nowhere, so it adds no second error.
            _quiet_stdout()
            why = "the reader closed it" if isinstance(error, BrokenPipeError) else error.strerror
            raise CommandError(
                f"Cannot write the export ({why}); it failed after at most {count:,} "
                + ("memory." if count == 1 else "memories.")
            ) from None
        where = f" from namespace {options['namespace']}" if options["namespace"] else ""
        self.stderr.write(f"\rExported {count:,} memories of {user.email}{where}.")


def _quiet_stdout() -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # no descriptor (a test's StringIO): nothing to flush there
        pass

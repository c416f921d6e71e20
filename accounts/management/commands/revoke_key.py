from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import keys, services


class Command(BaseCommand):
    help = (
        "Revoke an API key by id, display prefix (recall_live_XXXXXXXX) or the whole key. "
        "It stops working at once on every server of this database that listens for changes "
        "(all but those behind a transaction pooler without DATABASE_DIRECT_URL), "
        "and within seconds on any sharing Redis."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "key", help="The key's id, its display prefix as listed, or the whole key."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        wanted = options["key"].strip().rstrip("…")
        matches = services.find_keys(id_or_prefix=wanted)
        if not matches:
            raise CommandError(
                f"No API key matches {_shown(wanted)}. Give the key's id, its display prefix "
                f"({keys.KEY_PREFIX} and 8 characters, as list-keys shows it), or the whole key."
            )
        if len(matches) > 1:
            raise CommandError(f"{len(matches)} keys share that prefix; revoke by id instead.")
        revoked = services.revoke_keys([matches[0].id])
        if revoked:
            self.stdout.write(f"Revoked key {matches[0].prefix}… ({matches[0].id}).")
        else:
            self.stdout.write(f"Key {matches[0].prefix}… was already revoked.")


def _shown(wanted: str) -> str:
    """What the refusal repeats of the argument: never more of a key than its display prefix,
    wherever in it a key stands (``Bearer recall_live_…``, ``RECALL_API_KEY=recall_live_…``:
    review148), and nothing longer than a display prefix at all."""
    at = wanted.lower().find(keys.KEY_PREFIX.lower())
    if at >= 0:
        return keys.display_prefix(wanted[at:]) + "…"
    # No key's prefix in it: perhaps a key's secret alone, of which a display
    # prefix shows 8 characters, and so does this (review152).
    shown = keys.DISPLAY_LENGTH - len(keys.KEY_PREFIX)
    if len(wanted) > shown:
        return wanted[:shown] + "…"
    return wanted

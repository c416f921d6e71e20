"""What `recall serve` and `recall stdio` do before serving.

1. Apply migrations. (On the embedded default, connecting starts the
   bundled PostgreSQL.)
2. Make sure the configured embedding model has its HNSW index, and warn if
   memories embedded by another model are waiting for `manage.py reembed`.
3. On first run (no users yet), create a first user with a dashboard
   password and an API key, and show them once, with client configuration.
4. Load the embedding model, so the first request does not pay for it.

Steps 1 to 3 run under one advisory lock, so that processes starting together
(a fleet of app servers, or `recall serve` and a desktop client's `recall
stdio`) do them one at a time. Each step creates catalog objects with
``IF NOT EXISTS`` or after a look, and PostgreSQL's ``IF NOT EXISTS`` is no
guard against a concurrent creator: both sessions see nothing, both create,
and the second fails on a catalog unique index (``pg_class_relname_nsp_index``
for the HNSW index). ``recall/tests/test_startup.py`` forces that interleaving.
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from django.conf import settings
from django.core.management import call_command
from django.db import connection

logger = logging.getLogger("recall.startup")

# Any constant works; it only has to be the same in every process.
_STARTUP_LOCK = 0x7265_6361_6C6D


@dataclass
class FirstRun:
    email: str
    password: str
    api_key: str


def prepare(out: TextIO = sys.stdout, *, announce_urls: bool = True) -> FirstRun | None:
    with startup_lock():
        migrate()
        check_embeddings()
        first = bootstrap()
    if first is not None:
        announce(first, out, announce_urls=announce_urls)
    from memories import embeddings

    embeddings.get_embedder().load()
    return first


@contextmanager
def startup_lock() -> Iterator[None]:
    """Hold the start-up lock: one process at a time migrates, indexes and bootstraps."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [_STARTUP_LOCK])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_STARTUP_LOCK])


def migrate() -> None:
    call_command("migrate", interactive=False, verbosity=0)


def check_embeddings() -> None:
    from memories import embeddings, indexes, services

    model_id, dimensions = embeddings.model_spec()
    indexes.ensure_vector_index(model_id, dimensions)
    if services.has_stale_embeddings(model_id=model_id):
        logger.warning(
            "some memories were embedded by another model and are invisible to recall "
            "until you run `manage.py reembed`",
            extra={"model": model_id},
        )


def bootstrap() -> FirstRun | None:
    """Create the first user and key if there are no users at all; else do nothing.

    Call it under ``startup_lock()``, or two processes may both find no users.
    """
    from accounts import services
    from accounts.models import User

    if User.objects.exists():
        return None
    email = settings.RECALL_ADMIN_EMAIL
    password = secrets.token_urlsafe(12)
    user = services.create_user(
        email=email, password=password, tier="free", is_staff=True, is_superuser=True
    )
    _, raw = services.issue_key(user=user, name="first key")
    logger.info("created the first user and API key", extra={"email": email})
    return FirstRun(email=email, password=password, api_key=raw)


def announce(first: FirstRun, out: TextIO, *, announce_urls: bool = True) -> None:
    base = f"http://{_display_host()}:{settings.PORT}"
    cursor_config = {
        "mcpServers": {
            "recall": {
                "url": f"{base}/mcp",
                "headers": {"Authorization": f"Bearer {first.api_key}"},
            }
        }
    }
    desktop_config = {
        "mcpServers": {
            "recall": {
                "command": sys.executable,
                "args": ["-m", "recall", "stdio"],
                "env": {"RECALL_API_KEY": first.api_key},
            }
        }
    }
    lines = [
        "",
        "Recall: first run. These secrets are shown once; store them now.",
        "",
        f"  API key:    {first.api_key}",
        f"  Dashboard:  {base}/  (sign in as {first.email} / {first.password})"
        if announce_urls
        else f"  Dashboard sign-in: {first.email} / {first.password}",
        "",
        "Cursor (~/.cursor/mcp.json), or any client that speaks Streamable HTTP:",
        json.dumps(cursor_config, indent=2),
        "",
        "Claude Desktop (claude_desktop_config.json), over stdio:",
        json.dumps(desktop_config, indent=2),
        "",
    ]
    out.write("\n".join(lines) + "\n")
    out.flush()


def _display_host() -> str:
    return "127.0.0.1" if settings.HOST in ("0.0.0.0", "::", "") else settings.HOST  # noqa: S104

"""What `recall serve` and `recall stdio` do before serving.

1. Apply migrations. (On the embedded default, connecting starts the
   bundled PostgreSQL.)
2. Make sure the configured embedding model has its HNSW index, and warn if
   memories embedded by another model are waiting for `manage.py reembed`.
3. On first run (no users yet), create a first user with a dashboard
   password and an API key, and show them once, with client configuration.
4. Load the embedding model, so the first request does not pay for it (with
   several workers, each loads its own as it starts).

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
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from django.conf import settings
from django.core.management import call_command

from recall import env as env_module

logger = logging.getLogger("recall.startup")

# Frames the first-run banner, so it stands apart from the log lines around it.
RULE = "=" * 78

# Any constant works; it only has to be the same in every process.
_STARTUP_LOCK = 0x7265_6361_6C6D


@dataclass
class FirstRun:
    email: str
    password: str
    api_key: str
    tier: str


def prepare(
    out: TextIO = sys.stdout,
    *,
    announce_urls: bool = True,
    load_model: bool = True,
    announce_now: bool = True,
    first_user: bool = True,
) -> FirstRun | None:
    """Get ready to serve; ``load_model=False`` for a parent whose workers load their own.

    ``announce_now=False`` leaves the first run's banner to the caller (``Banner``).
    ``first_user=False`` creates no first user on an empty database: a process
    that serves one key (``recall stdio``) has no use for it, and its banner
    would go to a desktop client's log.
    """
    with startup_lock():
        migrate()
        check_embeddings()
        first = bootstrap() if first_user else None
    if first is not None and announce_now:
        announce(first, out, announce_urls=announce_urls)
    from memories import embeddings

    if load_model:
        embeddings.get_embedder().load()
    elif settings.EMBEDDING_PROVIDER == "local":
        # The workers each load the model; its files are checked once, here,
        # so a damaged install stops the server before any worker starts.
        from memories.embeddings import local

        local.check_model_files(settings.RECALL_LOCAL_MODEL_DIR)
    return first


@contextmanager
def startup_lock() -> Iterator[None]:
    """Hold the start-up lock: one process at a time migrates, indexes and bootstraps."""
    from core import pooling

    with pooling.advisory_lock(_STARTUP_LOCK):
        yield


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

    if services.has_users():
        return None
    email = settings.RECALL_ADMIN_EMAIL
    tier = settings.RECALL_ADMIN_TIER
    password = secrets.token_urlsafe(12)
    user = services.create_user(
        email=email, password=password, tier=tier, is_staff=True, is_superuser=True
    )
    _, raw = services.issue_key(user=user, name="first key")
    logger.info("created the first user and API key", extra={"email": email, "tier": tier})
    return FirstRun(email=email, password=password, api_key=raw, tier=tier)


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
    stdio_env, withheld = stdio_environment(first.api_key)
    desktop_config = {
        "mcpServers": {
            "recall": {
                "command": sys.executable,
                "args": ["-m", "recall", "stdio"],
                "env": stdio_env,
            }
        }
    }
    lines = [
        "",
        RULE,
        "Recall: first run. These secrets are shown once; store them now.",
        "",
        f"  API key:    {first.api_key}",
        f"  Dashboard:  {base}/  (sign in as {first.email} / {first.password})"
        if announce_urls
        else f"  Dashboard sign-in: {first.email} / {first.password}",
        f"  Tier:       {describe_tier(first.tier)}"
        " (RECALL_ADMIN_TIER chooses it before the first run)",
        f"  Data:       {data_directory()}  (RECALL_DATA_DIR)"
        if settings.EMBEDDED_DATABASE
        else "  Database:   DATABASE_URL",
        "",
        "Cursor (~/.cursor/mcp.json), or any client that speaks Streamable HTTP:",
        json.dumps(cursor_config, indent=2),
        "",
        "Claude Desktop (claude_desktop_config.json), over stdio on this machine,"
        " with this server's data:",
        json.dumps(desktop_config, indent=2),
        "",
        "(Claude Desktop on another computer reaches this server through mcp-remote instead:"
        " the dashboard's Keys page shows that configuration with a new key.)",
        RULE,
        "",
    ]
    if withheld:
        lines[-3:-3] = [
            f"Fill in the <...> entries with this server's own {', '.join(withheld)}:"
            " secrets are not printed.",
        ]
    out.write("\n".join(lines) + "\n")
    out.flush()


class Banner:
    """The first run's banner, shown once the server has finished starting.

    Printed while the server starts, it sits among the start-up log lines
    and is easy to scroll past; so it waits until ``/ready`` answers, and a
    moment more for the workers' last lines, then comes framed. It holds the
    only copy of the first password and key, so it is shown in any case: if
    the server stops (or never gets ready) first, it is shown then.
    """

    SETTLE_SECONDS = 1.0

    def __init__(self, first: FirstRun, out: TextIO) -> None:
        self.first = first
        self.out = out
        self.lock = threading.Lock()
        self.shown = False

    def show(self) -> None:
        with self.lock:
            if not self.shown:
                self.shown = True
                announce(self.first, self.out)

    def show_when_ready(self, url: str, timeout: float = 120.0) -> None:
        def wait() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not self.shown:
                try:
                    with urllib.request.urlopen(f"{url}/ready", timeout=2) as answer:  # noqa: S310 - our own server
                        if answer.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.25)
            time.sleep(self.SETTLE_SECONDS)
            self.show()

        threading.Thread(target=wait, name="first-run banner", daemon=True).start()


def stdio_environment(api_key: str) -> tuple[dict[str, str], list[str]]:
    """Return the environment `recall stdio` needs to reach this server's database and keys.

    A desktop client starts `recall stdio` with only the variables its
    configuration names, not the shell's that started `recall serve`. On the
    embedded default that is the data directory, which holds the database and
    the generated secrets. With an external database it is DATABASE_URL and
    the two secrets, whose values are not printed: they come back as
    ``<this server's NAME>`` and their names in the second item.
    """
    env = {"RECALL_API_KEY": api_key}
    names = ["SECRET_KEY", "API_KEY_SECRET"]
    if settings.EMBEDDED_DATABASE:
        env["RECALL_DATA_DIR"] = data_directory()
        withheld = [name for name in names if env_module.is_set(name)]
    else:
        withheld = ["DATABASE_URL", *names]
    env.update({name: f"<this server's {name}>" for name in withheld})
    return env, withheld


def data_directory() -> str:
    """Return the data directory as an absolute path, which holds from any working directory."""
    return str(Path(settings.RECALL_DATA_DIR).expanduser().resolve())


def describe_tier(tier: str) -> str:
    """Say what a tier allows: "Unlimited: no rate limit, no memory quota"."""
    from accounts import services as accounts_services
    from memories import services as memory_services
    from memories.services.quota import memories_in_words

    limit = accounts_services.rate_limit(tier)
    quota = memory_services.memory_limit(tier)
    rate = "no rate limit" if limit.calls is None else f"rate limit {limit.rate}"
    memories = "no memory quota" if quota is None else f"at most {memories_in_words(quota)}"
    return f"{limit.label}: {rate}, {memories}"


def _display_host() -> str:
    return "127.0.0.1" if settings.HOST in ("0.0.0.0", "::", "") else settings.HOST  # noqa: S104

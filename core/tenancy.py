"""The ways code reaches rows protected by row-level security.

``memories``, ``memory_history``, ``memory_jobs``, ``api_keys``, ``agents``,
``usage_events`` and ``forget_confirmations`` have row-level security ENABLED
and FORCED, so even
the table owner that Django connects as sees nothing unless a policy lets it.
The policies:

* ``tenant_isolation`` admits rows whose ``user_id`` equals the transaction's
  ``app.current_user_id`` setting. ``tenant(user_id)`` opens a transaction,
  switches to the ``recall_app`` role (NOBYPASSRLS, only the grants tools need)
  and sets that id, the way PostgREST and Supabase do. Unset, the setting reads
  as NULL and the policy admits nothing: it fails closed.
* ``tenant(user_id, agent_id=...)`` acts as one of the user's agents: it
  switches to ``recall_agent`` instead, whose own policies admit only that
  agent's rows of agent-scoped tables (``memories``, ``memory_history``,
  ``memory_jobs``, ``usage_events``, ``forget_confirmations``, ``api_keys``),
  by ``app.current_agent_id``.
  One exception: a transaction that names ``task_id`` may also *read* the
  memories any of the user's agents filed under that task (never change
  them). The task id is the capability: agents share findings by naming the
  same task. Without an agent, ``recall_app`` sees all of the user's rows,
  whichever agent wrote them: the user owns their agents.
* ``operator_access`` admits every row, but only while the active role is
  ``recall_operator``. ``operator()`` switches to it. Admin views, webhooks,
  API-key lookup and management commands use it, explicitly.

Every switch is ``SET LOCAL``: they end with the transaction, so a pooled
connection can never carry one request's identity into the next.

Every switch also names the actor (``core.context.actor``: the interface and API key
making the change) in ``app.actor`` and ``app.actor_key_id``, in the same
round trip. The database's history trigger writes them into every version
row of ``memory_history``; nothing else reads them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from core import context

APP_ROLE = "recall_app"
AGENT_ROLE = "recall_agent"
OPERATOR_ROLE = "recall_operator"
# The tables under forced row-level security: `recall doctor` checks them, the
# architecture test confines them to their app's services, and
# recall/tests/test_tenant_tables.py fails if a table of users' rows is neither
# listed here nor out of the tenant roles' reach.
TENANT_TABLES = frozenset(
    {
        "memories",
        "memory_history",
        "memory_jobs",
        "memory_import_chunks",
        "forget_confirmations",
        "api_keys",
        "agents",
        "usage_events",
        # The lexical index, derived from memories (memories/search.py).
        "search_documents",
        # Each namespace's generation, for the result cache (memories/results.py).
        "search_generations",
        "search_terms",
        "search_namespaces",
        "search_metadata",
    }
)

_active: ContextVar[str | None] = ContextVar("recall_tenancy_active", default=None)


@contextmanager
def tenant(
    user_id: uuid.UUID | str,
    using: str = DEFAULT_DB_ALIAS,
    *,
    agent_id: uuid.UUID | str | None = None,
    task_id: str | None = None,
    local_settings: Mapping[str, str | Computed] | None = None,
) -> Iterator[None]:
    """Run the block in one transaction that sees only ``user_id``'s rows.

    With ``agent_id``, only that agent's rows of agent-scoped tables, plus,
    for reading, memories filed under ``task_id`` by the user's other agents.
    ``local_settings`` are further settings for this transaction only (planner
    switches, say), sent in the same round trip as the role switch; a
    ``Computed`` one is worked out by the database, as the tenant.
    """
    label, statements = _tenant_opening(user_id, agent_id, task_id, local_settings)
    with _switch(label, statements, using, extra_names=list(local_settings or {})):
        yield


def _tenant_opening(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    task_id: str | None,
    local_settings: Mapping[str, str | Computed] | None,
) -> tuple[str, list[tuple[str, list[Any]]]]:
    """A tenant transaction's label and the statements that open it, after BEGIN."""
    uid = str(uuid.UUID(str(user_id)))
    aid = str(uuid.UUID(str(agent_id))) if agent_id is not None else ""
    statements: list[tuple[str, list[Any]]] = [
        (f"SET LOCAL ROLE {AGENT_ROLE if aid else APP_ROLE}", []),
        (
            "SELECT set_config('app.current_user_id', %s, true),"
            " set_config('app.current_agent_id', %s, true),"
            " set_config('app.current_task_id', %s, true),"
            " set_config('app.actor', %s, true), set_config('app.actor_key_id', %s, true)",
            [uid, aid, task_id or "", *_actor()],
        ),
    ]
    if local_settings:
        statements.append(_settings(local_settings))
    label = (
        f"tenant:{uid}" + (f"/agent:{aid}" if aid else "") + (f"/task:{task_id}" if task_id else "")
    )
    return label, statements


@dataclass(frozen=True)
class Rows:
    """What ``read_once`` read: the column names and the rows."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


def read_once(
    user_id: uuid.UUID | str,
    sql: str,
    params: Mapping[str, Any] | list[Any],
    *,
    agent_id: uuid.UUID | str | None = None,
    task_id: str | None = None,
    local_settings: Mapping[str, str | Computed] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Rows | None:
    """Run one read-only statement in a tenant transaction of its own, in one round trip.

    The same transaction as ``tenant()`` with the statement inside it (BEGIN,
    the role switch and the settings, the statement, COMMIT), sent together
    through psycopg's pipeline: one round trip instead of three, on every
    search (BENCHMARKS.md, "Efficiency: the cached recall's path"). A failure
    rolls the transaction back, as ``tenant()`` would.

    Returns None, having sent nothing, where it cannot: inside a transaction
    or another context (a test's, say), or on a connection without a pipeline;
    the caller then uses ``tenant()``.
    """
    read = read_many(
        user_id,
        [(sql, params)],
        agent_id=agent_id,
        task_id=task_id,
        local_settings=local_settings,
        using=using,
    )
    return read[0] if read is not None else None


def read(
    user_id: uuid.UUID | str,
    sql: str,
    params: Mapping[str, Any] | list[Any],
    *,
    agent_id: uuid.UUID | str | None = None,
    task_id: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Rows:
    """Run one read-only statement as the tenant: ``read_once`` where it can, else ``tenant()``."""
    once = read_once(user_id, sql, params, agent_id=agent_id, task_id=task_id, using=using)
    if once is not None:
        return once
    opened = tenant(user_id, using, agent_id=agent_id, task_id=task_id)
    with opened, connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return Rows(_names(cursor), cursor.fetchall())


def read_many(
    user_id: uuid.UUID | str,
    statements: Sequence[tuple[str, Mapping[str, Any] | list[Any]]],
    *,
    agent_id: uuid.UUID | str | None = None,
    task_id: str | None = None,
    local_settings: Mapping[str, str | Computed] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[Rows] | None:
    """``read_once`` for several read-only statements, run in order in one transaction.

    Each statement has its own snapshot (READ COMMITTED), as it would in
    ``tenant()``. Returns each one's rows, or None where ``read_once`` would.
    """
    if _active.get() is not None:
        return None
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit():
        return None
    connection.ensure_connection()
    raw = connection.connection
    if not callable(getattr(raw, "pipeline", None)):
        return None
    label, opening = _tenant_opening(user_id, agent_id, task_id, local_settings)
    token = _active.set(label)
    try:
        with connection.wrap_database_errors:
            try:
                with ExitStack() as stack:
                    first = stack.enter_context(raw.cursor())
                    cursors = [stack.enter_context(raw.cursor()) for _ in statements]
                    with raw.pipeline():
                        first.execute("BEGIN")
                        for statement, values in opening:
                            first.execute(statement, values)
                        for cursor, (sql, params) in zip(cursors, statements, strict=True):
                            cursor.execute(sql, params)
                        first.execute("COMMIT")
                    # Sent and answered as the pipeline ended; the rows wait on the cursors.
                    return [Rows(_names(cursor), cursor.fetchall()) for cursor in cursors]
            except BaseException:
                # Whatever failed, the explicit transaction must not outlive the call.
                _roll_back(raw)
                raise
    finally:
        _active.reset(token)


def _names(cursor: Any) -> list[str]:
    return [column.name for column in cursor.description or []]


def _roll_back(raw: Any) -> None:
    if getattr(raw, "closed", True):
        return
    # A broken connection cannot roll back; Django closes it after the error.
    with suppress(Exception):
        raw.execute("ROLLBACK")


@dataclass(frozen=True)
class Computed:
    """A setting's value as a scalar SQL expression over the tenant's own rows.

    It is evaluated in the transaction's opening round trip, after the role
    switch, so the tenant policies apply to what it reads.
    """

    sql: str
    params: list[Any]


def _settings(values: Mapping[str, str | Computed]) -> tuple[str, list[Any]]:
    """One statement that sets every local setting: each statement costs a parse and a plan.

    It is planned before any of its settings takes effect, so a ``Computed``
    one cannot depend on another set here.
    """
    calls, params = [], []
    for name, value in values.items():
        if isinstance(value, Computed):
            calls.append(f"set_config(%s, ({value.sql})::text, true)")
            params += [name, *value.params]
        else:
            calls.append("set_config(%s, %s, true)")
            params += [name, value]
    return "SELECT " + ", ".join(calls), params


@contextmanager
def operator(using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """Run the block in one transaction that may read and write every tenant's rows."""
    statements = [
        (f"SET LOCAL ROLE {OPERATOR_ROLE}", []),
        (
            "SELECT set_config('app.actor', %s, true), set_config('app.actor_key_id', %s, true)",
            _actor(),
        ),
    ]
    with _switch("operator", statements, using):
        yield


def _actor() -> list[str]:
    who = context.actor.get()
    if who is None:
        return ["", ""]
    return [who.client, str(who.api_key_id) if who.api_key_id else ""]


def current() -> str | None:
    """Return ``"operator"``, ``"tenant:<uuid>[/agent:<uuid>][/task:<id>]"`` or None."""
    return _active.get()


@contextmanager
def _switch(
    label: str,
    statements: list[tuple[str, list[str]]],
    using: str,
    extra_names: list[str] | None = None,
) -> Iterator[None]:
    active = _active.get()
    if active == label:  # re-entering the same identity changes nothing but settings
        if extra_names:  # the settings are the last statement
            with connections[using].cursor() as cursor:
                cursor.execute(*statements[-1])
        yield
        return
    if active is not None:
        raise RuntimeError(f"cannot enter {label.split(':')[0]} context inside {active}")
    connection = connections[using]
    nested = connection.in_atomic_block
    token = _active.set(label)
    try:
        with transaction.atomic(using=using):
            # psycopg sends the transaction's BEGIN on its own and waits for
            # it; in a pipeline, BEGIN and the switch go out together and cost
            # one round trip instead of two (of the five a recall makes).
            with connection.cursor() as cursor, pipeline(cursor):
                for sql, params in statements:
                    cursor.execute(sql, params)
            yield
            if nested:
                # Inside an outer transaction (as in tests) SET LOCAL would
                # outlive this block; put the session back as it was.
                resets = "".join(f"; SET LOCAL {name} TO DEFAULT" for name in extra_names or ())
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SET LOCAL ROLE NONE; SELECT set_config('app.current_user_id', '', true),"
                        " set_config('app.current_agent_id', '', true),"
                        " set_config('app.current_task_id', '', true),"
                        " set_config('app.actor', '', true),"
                        " set_config('app.actor_key_id', '', true)" + resets
                    )
    finally:
        _active.reset(token)


def pipeline(cursor: Any) -> AbstractContextManager[Any]:
    """Return psycopg's pipeline for the cursor's connection, where there is one.

    Statements executed inside it go out together and cost one round trip;
    each cursor's results are there to fetch once the block ends.
    """
    pipeline = getattr(getattr(cursor, "connection", None), "pipeline", None)
    return pipeline() if callable(pipeline) else nullcontext()

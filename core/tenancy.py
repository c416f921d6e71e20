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
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
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
        "forget_confirmations",
        "api_keys",
        "agents",
        "usage_events",
        # The lexical index, derived from memories (memories/search.py).
        "search_documents",
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
    uid = str(uuid.UUID(str(user_id)))
    aid = str(uuid.UUID(str(agent_id))) if agent_id is not None else ""
    statements = [
        (f"SET LOCAL ROLE {AGENT_ROLE if aid else APP_ROLE}", []),
        (
            "SELECT set_config('app.current_user_id', %s, true),"
            " set_config('app.current_agent_id', %s, true),"
            " set_config('app.current_task_id', %s, true),"
            " set_config('app.actor', %s, true), set_config('app.actor_key_id', %s, true)",
            [uid, aid, task_id or "", *_actor()],
        ),
    ]
    extra = [_settings(local_settings)] if local_settings else []
    label = (
        f"tenant:{uid}" + (f"/agent:{aid}" if aid else "") + (f"/task:{task_id}" if task_id else "")
    )
    with _switch(label, statements + extra, using, extra_names=list(local_settings or {})):
        yield


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

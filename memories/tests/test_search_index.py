"""The lexical index: kept in step with memories by the database, private to each tenant,
and searched through its GIN index although row-level security is forced."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection, connections, transaction

from accounts.tiers import Tier
from core import tenancy
from memories import services
from memories.models import Memory

TEA = "Alice drinks Darjeeling tea every morning."
COFFEE = "Alice drinks espresso after lunch."


def remember(user_id, content, namespace="default", metadata=None) -> str:
    return services.remember(
        user_id=user_id, tier=Tier.PRO, content=content, namespace=namespace, metadata=metadata
    )["id"]


def index_of(user_id) -> dict[str, object]:
    """Read the tenant's documents, term counts and namespace totals as that tenant."""
    with tenancy.tenant(user_id), connection.cursor() as cursor:
        cursor.execute(
            "SELECT namespace, memory_id::text, vector::text, length FROM search_documents"
        )
        docs = {(ns, memory_id): (vector, length) for ns, memory_id, vector, length in cursor}
        cursor.execute("SELECT namespace, lexeme, documents FROM search_terms")
        terms = {(ns, lexeme): count for ns, lexeme, count in cursor}
        cursor.execute("SELECT namespace, documents, length FROM search_namespaces")
        spaces = {ns: (count, length) for ns, count, length in cursor}
    return {"documents": docs, "terms": terms, "namespaces": spaces}


def recount(user_id) -> dict[str, object]:
    """What the counts must be, computed from the documents themselves."""
    with tenancy.tenant(user_id), connection.cursor() as cursor:
        cursor.execute(
            "SELECT d.namespace, v.lexeme, count(*) FROM search_documents d,"
            " unnest(d.vector) AS v GROUP BY 1, 2"
        )
        terms = {(ns, lexeme): count for ns, lexeme, count in cursor}
        cursor.execute(
            "SELECT namespace, count(*), sum(length) FROM search_documents GROUP BY namespace"
        )
        spaces = {ns: (count, length) for ns, count, length in cursor}
    return {"terms": terms, "namespaces": spaces}


def assert_consistent(user_id) -> dict[str, object]:
    index = index_of(user_id)
    expected = recount(user_id)
    assert index["terms"] == expected["terms"]
    assert index["namespaces"] == expected["namespaces"]
    return index


def test_a_remembered_memory_gets_its_document_and_counts(cast):
    memory_id = remember(cast.alice.id, TEA, metadata={"source": "Slack", "weight": 3})
    remember(cast.alice.id, COFFEE)

    index = assert_consistent(cast.alice.id)

    vector, length = index["documents"][("default", memory_id)]
    # English analysis: stemmed words, no stop words; metadata's strings, not its numbers.
    for lexeme in ("'alic'", "'drink'", "'darjeel'", "'tea'", "'morn'", "'slack'"):
        assert lexeme in vector, (lexeme, vector)
    assert "'3'" not in vector and "'weight'" not in vector and "'source'" not in vector
    assert length == len(vector.split())
    assert index["terms"][("default", "alic")] == 2
    assert index["terms"][("default", "tea")] == 1
    assert index["namespaces"]["default"][0] == 2


def test_names_numbers_and_identifiers_survive_analysis(cast):
    memory_id = remember(
        cast.alice.id,
        "Ticket CVE-2021-44228: bump log4j to v2.17.1 in payments_service, ask O'Brien",
    )

    vector = index_of(cast.alice.id)["documents"][("default", memory_id)][0]

    for lexeme in ("'log4j'", "'v2.17.1'", "'payment'", "'servic'", "'brien'", "'2021'", "'44228'"):
        assert lexeme in vector, (lexeme, vector)


def test_the_words_inside_hosts_and_addresses_are_words_of_the_memory(cast):
    memory_id = remember(
        cast.alice.id,
        "Mail goes via smtp.sendgrid.net; press@lumen.dev takes enquiries, see"
        " https://grafana.tools.acme.io/d/abc, kafka-orders.corp and rabbit-01.corp.",
        metadata={"docs": "wiki.acme.io"},
    )

    vector = index_of(cast.alice.id)["documents"][("default", memory_id)][0]
    lexemes = {entry.split(":")[0].strip("'") for entry in vector.split()}

    # The whole token stays; its labels that are words come as words too.
    assert {"smtp.sendgrid.net", "press@lumen.dev", "grafana.tools.acme.io"} <= lexemes
    assert {"sendgrid", "smtp", "press", "lumen", "grafana", "tool", "acm"} <= lexemes
    assert {"kafka", "order", "rabbit", "wiki"} <= lexemes
    # Not the last label, which names no subject and would match the word "dev".
    assert not {"net", "dev", "io", "corp"} & lexemes
    assert_consistent(cast.alice.id)


def test_a_word_the_parser_reads_on_its_own_is_not_counted_twice(cast):
    memory_id = remember(
        cast.alice.id,
        "Ask straße@bücher.de or https://user@host:8443/x about rabbit-01.corp,"
        " acme.io, wiki.acme.io, Docs.Acme.io and docs.acme.io",
    )

    vector = index_of(cast.alice.id)["documents"][("default", memory_id)][0]
    positions = dict(entry.rsplit(":", 1) for entry in vector.split())

    for lexeme in ("'straße'", "'bücher'", "'user'", "'host'", "'rabbit'", "'acm'", "'doc'"):
        assert positions[lexeme].count(",") == 0, (lexeme, vector)


def test_numbers_and_versions_add_no_parts(cast):
    memory_id = remember(cast.alice.id, "The NAS is at 192.168.1.40 on Python 3.11, log4j v2.17.1")

    vector = index_of(cast.alice.id)["documents"][("default", memory_id)][0]
    lexemes = {entry.split(":")[0].strip("'") for entry in vector.split()}

    assert lexemes == {"nas", "192.168.1.40", "python", "3.11", "log4j", "v2.17.1"}


def test_updating_content_moves_the_counts_and_a_new_vector_alone_does_not(cast):
    memory_id = remember(cast.alice.id, TEA)
    remember(cast.alice.id, COFFEE)

    services.update_memory(user_id=cast.alice.id, id=memory_id, content="Alice drinks rooibos.")
    index = assert_consistent(cast.alice.id)
    assert ("default", "tea") not in index["terms"]
    assert index["terms"][("default", "rooibo")] == 1
    assert index["terms"][("default", "drink")] == 2

    with tenancy.operator():
        Memory.objects.filter(id=memory_id).update(embedding=[0.5] * 384)
    assert index_of(cast.alice.id) == index


def test_metadata_updates_are_indexed_too(cast):
    memory_id = remember(cast.alice.id, TEA, metadata={"project": "Orinoco"})

    services.update_memory(user_id=cast.alice.id, id=memory_id, metadata={"project": "Amazon"})

    index = assert_consistent(cast.alice.id)
    assert ("default", "orinoco") not in index["terms"]
    assert index["terms"][("default", "amazon")] == 1


def test_forgetting_removes_the_document_and_counts_that_reach_zero(cast):
    first = remember(cast.alice.id, TEA)
    second = remember(cast.alice.id, COFFEE)

    services.forget_by_id(user_id=cast.alice.id, id=first)
    index = assert_consistent(cast.alice.id)
    assert ("default", "tea") not in index["terms"]
    assert index["terms"][("default", "alic")] == 1

    services.forget_by_id(user_id=cast.alice.id, id=second)
    assert index_of(cast.alice.id) == {"documents": {}, "terms": {}, "namespaces": {}}


def test_counts_are_kept_per_namespace(cast):
    remember(cast.alice.id, TEA, namespace="home")
    remember(cast.alice.id, TEA, namespace="work")
    remember(cast.alice.id, COFFEE, namespace="work")

    index = assert_consistent(cast.alice.id)

    assert index["terms"][("home", "alic")] == 1
    assert index["terms"][("work", "alic")] == 2
    assert index["namespaces"]["home"][0] == 1
    assert index["namespaces"]["work"][0] == 2


def test_a_bulk_write_on_the_operator_path_is_indexed_in_one_statement(cast):
    remember(cast.alice.id, TEA)
    remember(cast.charlie.id, TEA)

    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO memories (id, user_id, namespace, content, content_hash, embedding,"
            " embedding_model, metadata)"
            " SELECT gen_random_uuid(), user_id, namespace, content || ' again ' || n,"
            " md5(n::text), embedding, embedding_model, metadata"
            " FROM memories, generate_series(1, 3) AS n"
        )
        cursor.execute("DELETE FROM memories WHERE content LIKE '%again 2'")

    for user in (cast.alice, cast.charlie):
        index = assert_consistent(user.id)
        assert index["namespaces"]["default"][0] == 3
        assert index["terms"][("default", "tea")] == 3


def test_truncating_memories_empties_the_index(cast):
    remember(cast.alice.id, TEA)

    with connection.cursor() as cursor:
        # Django's foreign keys are deferred; the test's transaction holds their checks.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("TRUNCATE memories CASCADE")

    with tenancy.operator(), connection.cursor() as cursor:
        for table in ("search_documents", "search_terms", "search_namespaces"):
            cursor.execute(f"SELECT count(*) FROM {table}")  # noqa: S608
            assert cursor.fetchone()[0] == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_to_one_namespace_keep_exact_counts(cast):
    contents = [f"Alice planted tomatoes, basil and tulips on day {n}." for n in range(24)]

    def write(part: list[str]) -> None:
        try:
            for content in part:
                remember(cast.alice.id, content)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(contents[n::4],)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    index = assert_consistent(cast.alice.id)
    assert index["namespaces"]["default"][0] == 24
    assert index["terms"][("default", "tomato")] == 24


# Isolation ---------------------------------------------------------------------------


def test_a_tenant_sees_only_its_own_index_rows(cast):
    remember(cast.alice.id, TEA)
    remember(cast.charlie.id, COFFEE)

    alice = index_of(cast.alice.id)
    charlie = index_of(cast.charlie.id)

    assert ("default", "tea") in alice["terms"] and ("default", "espresso") not in alice["terms"]
    assert ("default", "espresso") in charlie["terms"] and ("default", "tea") not in charlie[
        "terms"
    ]
    assert len(alice["documents"]) == len(charlie["documents"]) == 1


def test_the_owner_role_without_context_sees_no_index_rows(cast):
    remember(cast.alice.id, TEA)

    with connection.cursor() as cursor:
        for table in ("search_documents", "search_terms", "search_namespaces"):
            cursor.execute(f"SELECT count(*) FROM {table}")  # noqa: S608
            assert cursor.fetchone()[0] == 0


@pytest.mark.parametrize("table", ["search_documents", "search_terms", "search_namespaces"])
def test_no_tenant_role_can_write_the_search_tables_directly(cast, agents, table):
    from django.db.utils import ProgrammingError

    # Only the triggers write them (as recall_search); a tenant writing its
    # own rows, let alone another's, is refused before any policy applies.
    for agent in (None, agents.research):
        with (
            pytest.raises(ProgrammingError, match="permission denied"),
            tenancy.tenant(cast.alice.id, agent_id=agent.id if agent else None),
            connection.cursor() as cursor,
        ):
            cursor.execute(f"DELETE FROM {table} WHERE user_id = %s", [str(cast.alice.id)])  # noqa: S608


def test_an_agent_cannot_read_the_search_tables_at_all(cast, agents):
    from django.db.utils import ProgrammingError

    # They hold the words of every agent's memories; an agent reads them only
    # through the search functions, which apply memories' agent rule.
    remember(cast.alice.id, TEA)
    for table in ("search_documents", "search_terms", "search_namespaces"):
        with (
            pytest.raises(ProgrammingError, match="permission denied"),
            tenancy.tenant(cast.alice.id, agent_id=agents.research.id),
            connection.cursor() as cursor,
        ):
            cursor.execute(f"SELECT count(*) FROM {table}")  # noqa: S608


def test_the_lexical_function_reads_only_the_callers_tenant(cast):
    remember(cast.charlie.id, "Charlie's locker code is 7731.")

    for user in (cast.alice, cast.charlie):
        with tenancy.tenant(user.id), connection.cursor() as cursor:
            # Both forms: 0024's, which recall_rank() calls, and 0006's, kept for
            # servers of the release before it.
            found = []
            for held in ("", ", NULL, true"):
                call = (
                    "SELECT memory_id FROM recall_lexical_matches('default', '{7731}',"
                    " '{7731}', '{1}', 5, 0.9, 0.4, 10, NULL, NULL, NULL, NULL, NULL"
                )
                cursor.execute(call + held + ")")
                found.append(len(cursor.fetchall()))
        assert found == ([1, 1] if user == cast.charlie else [0, 0])


def test_only_the_tenant_roles_may_call_the_lexical_function(cast):
    with connection.cursor() as cursor:
        for held in ("", ", timestamptz, boolean"):
            form = (
                "recall_lexical_matches(text, text[], text[], float8[], float8, float8, float8,"
                " integer, timestamptz, timestamptz, jsonb, text[], jsonb" + held + ")"
            )
            cursor.execute(
                "SELECT has_function_privilege(r, %s, 'EXECUTE')"
                " FROM unnest(ARRAY['recall_app', 'recall_agent', 'recall_operator', 'public']) r",
                [form],
            )
            assert [row[0] for row in cursor.fetchall()] == [True, True, False, False]
        cursor.execute(
            "SELECT rolcanlogin, rolbypassrls, rolsuper FROM pg_roles"
            " WHERE rolname = 'recall_search'"
        )
        assert cursor.fetchone() == (False, False, False)
        cursor.execute(
            "SELECT pg_has_role(current_user, 'recall_search', 'USAGE'),"
            " p.prosecdef, pg_get_userbyid(p.proowner), p.proconfig, p.prorows"
            " FROM pg_proc p WHERE p.proname = 'recall_lexical_matches'"
        )
        forms = cursor.fetchall()
    assert len(forms) == 2
    for member, definer, owner, config, rows in forms:
        # The owner role must not inherit recall_search's USING (true) policies.
        assert not member
        assert definer and owner == "recall_search"
        # The GIN index by bitmap scans only (0009), a pool's estimate (0011).
        assert {"search_path=pg_catalog, public", "enable_seqscan=off"} <= set(config)
        assert {"enable_indexscan=off", "enable_indexonlyscan=off"} <= set(config)
        assert rows == 50


# The GIN index under forced row-level security ----------------------------------------


def lexical_index_scans() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_xact_numscans('search_documents_match'::regclass)")
        return cursor.fetchone()[0]


def grow_the_index(rows: int) -> None:
    """Leave ``rows`` rolled-back documents in the table and its index, as a busy database has."""
    with transaction.atomic():
        with tenancy.operator(), connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO search_documents"
                " (memory_id, user_id, namespace, created_at, vector, length)"
                " SELECT gen_random_uuid(), gen_random_uuid(), 'elsewhere', now(),"
                " to_tsvector('simple', 'word' || g || ' topic' || (g %% 97)), 2"
                " FROM generate_series(1, %s) AS g",
                [rows],
            )
        transaction.set_rollback(True)


@pytest.mark.parametrize("grown", [0, 5_000, 30_000])
def test_a_lexical_search_reads_the_gin_index_under_forced_rls(cast, grown):
    for n in range(30):
        remember(cast.alice.id, f"Routine note number {n} about the garden.")
    remember(cast.alice.id, "The locker code at the Kessler gym is 7731.")
    # A grown index with few live rows made a full primary-key scan look
    # cheaper to the planner (migration 0009); it must not be taken.
    grow_the_index(grown)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE search_documents")

    with transaction.atomic():
        # Plans this connection cached in earlier tests, on other table sizes, go.
        with connection.cursor() as cursor:
            cursor.execute("DISCARD PLANS")
        before = lexical_index_scans()
        found = services.recall(user_id=cast.alice.id, query="Kessler 7731", mode="lexical")
        after = lexical_index_scans()

    assert [r["content"] for r in found][:1] == ["The locker code at the Kessler gym is 7731."]
    assert after == before + 1


def plan_as(role: str, user_id) -> str:
    """EXPLAIN the lexical function's match, as ``role``, in a tenant's transaction."""
    with transaction.atomic(), connection.cursor() as cursor:
        # The owner holds ADMIN on recall_search (it created it) but is no
        # member; it becomes one for this rolled-back transaction only.
        if role == "recall_search":
            cursor.execute("GRANT recall_search TO CURRENT_USER")
        cursor.execute(f"SET LOCAL ROLE {role}")
        cursor.execute("SELECT set_config('app.current_user_id', %s, true)", [str(user_id)])
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            "EXPLAIN SELECT memory_id FROM search_documents"
            " WHERE user_id = recall_current_user_id() AND namespace = 'default'"
            " AND recall_search_keys(user_id, namespace, tsvector_to_array(vector))"
            " && recall_search_keys(recall_current_user_id(), 'default', '{7731}')"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    return plan


def test_the_match_is_an_index_condition_only_for_the_search_role(cast):
    remember(cast.alice.id, "The locker code is 7731.")

    as_search = plan_as("recall_search", cast.alice.id)
    as_tenant = plan_as("recall_app", cast.alice.id)

    # Behind the tenant policy, the non-leakproof && may not be evaluated
    # before it, so it cannot drive the index; as recall_search it does.
    index_condition = [line for line in as_search.splitlines() if "Index Cond" in line]
    assert "search_documents_match" in as_search
    assert any("&&" in line for line in index_condition), as_search
    assert not any("&&" in line for line in as_tenant.splitlines() if "Index Cond" in line), (
        as_tenant
    )


def test_the_backfill_indexes_memories_stored_before_the_index(cast):
    from importlib import import_module

    remember(cast.alice.id, TEA)
    remember(cast.charlie.id, COFFEE)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE search_documents, search_terms, search_namespaces")
    assert index_of(cast.alice.id)["documents"] == {}

    fill = import_module("memories.migrations.0007_fill_search_documents")

    class Editor:
        pass

    editor = Editor()
    editor.connection = connection
    fill.fill_search_documents(None, editor)

    for user, word in ((cast.alice, "tea"), (cast.charlie, "espresso")):
        index = assert_consistent(user.id)
        assert index["terms"][("default", word)] == 1
    assert Counter(ns for ns, _ in index_of(cast.alice.id)["documents"]) == {"default": 1}


PARTS = "memories.migrations.0025_search_address_parts"


class Editor:
    """What a migration's RunPython step reads of the schema editor: its connection."""

    def __init__(self) -> None:
        self.connection = connection


def written_by(memory_id: str) -> int:
    """The transaction that last wrote a memory's search document (its xmin)."""
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT xmin::text::bigint FROM search_documents WHERE memory_id = %s", [memory_id]
        )
        return cursor.fetchone()[0]


def wait_until_blocked(migrator: threading.Thread, holder: str) -> None:
    """Return once a session of this database waits for a lock; fail after 15 s."""
    for _ in range(300):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                return
        migrator.join(0.05)
    pytest.fail(f"the migration never waited for {holder}")


def test_the_parts_migration_analyses_older_documents_again_and_back(cast, monkeypatch):
    """0025 on documents analysed before it: the parts arrive, and leave when undone."""
    from importlib import import_module

    parts = import_module(PARTS)
    monkeypatch.setattr(parts, "BATCH", 2)  # several batches, each after the last's id
    mail = remember(cast.alice.id, "Outgoing mail is relayed through smtp.sendgrid.net.")
    remember(cast.charlie.id, "Press enquiries go to press@lumen.dev.")
    tea = remember(cast.alice.id, TEA)
    remember(cast.charlie.id, "Backups land in backups.example.org nightly.")
    remember(cast.alice.id, "Dashboards live at grafana.acme.io.")
    before = index_of(cast.alice.id)["documents"][("default", tea)]

    with connection.cursor() as cursor:
        cursor.execute(parts.OLD)
    parts.reanalyse(None, Editor())
    assert ("default", "sendgrid") not in assert_consistent(cast.alice.id)["terms"]
    assert ("default", "grafana") not in index_of(cast.alice.id)["terms"]
    assert ("default", "press") in assert_consistent(cast.charlie.id)["terms"]
    assert ("default", "lumen") not in index_of(cast.charlie.id)["terms"]
    untouched = written_by(tea)

    with connection.cursor() as cursor:
        cursor.execute(parts.NEW)
    parts.reanalyse(None, Editor())
    index = assert_consistent(cast.alice.id)
    assert index["terms"][("default", "sendgrid")] == 1
    assert index["terms"][("default", "grafana")] == 1
    assert "'sendgrid'" in index["documents"][("default", mail)][0]
    # A document whose words do not change is not written again.
    assert index["documents"][("default", tea)] == before
    assert written_by(tea) == untouched
    charlie = assert_consistent(cast.charlie.id)["terms"]
    assert charlie[("default", "lumen")] == charlie[("default", "backup")] == 1


@pytest.mark.django_db(transaction=True)
def test_an_edit_committed_while_the_parts_migration_runs_keeps_its_words(cast):
    """A batch waits for a write in progress and reads what it committed, not what it replaced."""
    from importlib import import_module

    parts = import_module(PARTS)
    memory_id = remember(cast.alice.id, "Outgoing mail is relayed through smtp.sendgrid.net.")
    try:
        # The document as it was before 0025: the batch has it to rewrite.
        with connection.cursor() as cursor:
            cursor.execute(parts.OLD)
        parts.reanalyse(None, Editor())
    finally:
        with connection.cursor() as cursor:
            cursor.execute(parts.NEW)  # committed: this test's database outlives it
    assert "'sendgrid'" not in index_of(cast.alice.id)["documents"][("default", memory_id)][0]
    edited, release = threading.Event(), threading.Event()

    def edit() -> None:
        try:
            with transaction.atomic():
                services.update_memory(
                    user_id=cast.alice.id, id=memory_id, content="The giraffe eats acacia leaves."
                )
                edited.set()
                release.wait(30)
        finally:
            connections.close_all()

    def migrate() -> None:
        try:
            parts.reanalyse(None, Editor())
        finally:
            connections.close_all()

    editor_thread = threading.Thread(target=edit)
    migrator = threading.Thread(target=migrate)
    editor_thread.start()
    try:
        assert edited.wait(30)
        migrator.start()
        # Let the edit commit only once the migration waits on a lock it holds.
        wait_until_blocked(migrator, "the edit in progress")
    finally:
        release.set()
        editor_thread.join()
        if migrator.is_alive():
            migrator.join()

    index = assert_consistent(cast.alice.id)
    vector = index["documents"][("default", memory_id)][0]
    assert "'giraff'" in vector and "'sendgrid'" not in vector, vector
    assert ("default", "sendgrid") not in index["terms"]


@pytest.mark.django_db(transaction=True)
def test_a_batch_that_loses_a_deadlock_to_a_writer_runs_again(cast, monkeypatch):
    """A session that takes memories out of id order (an operator's SQL, say: the
    service's writers take them in id order) closes a cycle with a batch; the batch,
    rolled back to settle it, is run again, and the session's write goes through."""
    from importlib import import_module

    from memories.tests.test_write_races import crossing

    parts = import_module(PARTS)
    monkeypatch.setattr(parts, "PAUSE", 0.05)
    texts = ["Mail relays through smtp.sendgrid.net.", "The office wifi password is hunter2."]
    low, high = sorted(remember(cast.alice.id, text) for text in texts)
    lost: list[bool] = []
    judged = parts._lost_race

    def lost_race(error) -> bool:
        lost.append(judged(error))
        return lost[-1]

    monkeypatch.setattr(parts, "_lost_race", lost_race)
    # The batch takes `low`, then waits for `high`, which the session holds;
    # the session then asks for `low`: a cycle.
    crossing(
        cast.alice.id,
        lambda: parts.reanalyse(None, Editor()),
        high,
        "UPDATE memories SET priority = 'high' WHERE id = %s",
        low,
    )

    assert lost == [True]  # the batch lost the deadlock once, and its second try won
    with tenancy.operator():
        assert Memory.objects.get(id=low).priority == "high"
    index = assert_consistent(cast.alice.id)
    assert index["terms"][("default", "sendgrid")] == 1


# What a search reads besides the index ------------------------------------------------


def pending_pages(index: str) -> int:
    """Merge ``index``'s pending list into the index; return how many pages it held."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT gin_clean_pending_list(%s::regclass)", [index])
        return cursor.fetchone()[0]


@pytest.mark.parametrize("index", ["search_documents_match", "memories_metadata_gin"])
def test_new_entries_go_straight_into_the_gin_indexes(cast, index):
    # A pending list is read whole by every search until a vacuum merges it
    # (migration 0011): 179 pages after 3,000 memories made the lexical side
    # 16 times slower. 300 memories would leave several pages of entries.
    pending_pages(index)
    tea = remember(cast.alice.id, TEA)
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO memories (id, user_id, namespace, content, content_hash, embedding,"
            " embedding_model, metadata)"
            " SELECT gen_random_uuid(), %s, 'default',"
            " 'Note ' || n || ' about topic' || (n %% 37) || ' and ticket T-' || (n * 7919),"
            " md5(n::text), m.embedding, m.embedding_model,"
            " jsonb_build_object('ticket', n, 'topic', n %% 37)"
            " FROM memories m, generate_series(1, 300) AS n WHERE m.id = %s",
            [str(cast.alice.id), tea],
        )
        cursor.execute("SELECT count(*) FROM memories WHERE user_id = %s", [str(cast.alice.id)])
        assert cursor.fetchone()[0] == 301

    assert pending_pages(index) == 0


def test_the_planner_expects_a_pool_of_lexical_matches_not_a_thousand(cast):
    # recall_rank() joins the matches to memories; at a function's default
    # estimate of 1,000 rows its generic plan hashed every memory of the
    # tenant instead of reading the pool's 50 by primary key (migration 0011).
    from memories import search

    with tenancy.tenant(cast.alice.id), connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN SELECT memory_id FROM recall_lexical_matches('default', '{7731}',"
            " '{7731}', '{1}', 5, 0.9, 0.4, %s, NULL, NULL, NULL, NULL, NULL, NULL, true)",
            [search.POOL],
        )
        plan = cursor.fetchone()[0]
    assert f"rows={search.POOL} " in plan, plan


BRACKETS = "memories.migrations.0028_search_words_in_angle_brackets"
GENERIC = "In the billing service, use List<String> for invoice names."
MARKUP = 'Wrap the pricing widget in <section class="pricing-card"> markup.'


def lexically(user_id, query: str) -> list[str]:
    found = services.recall(
        user_id=user_id, query=query, mode="lexical", threshold=0.0, use_cache=False
    )
    return [m["id"] for m in found]


def test_a_word_inside_angle_brackets_is_found_by_a_lexical_search(cast):
    """The parser read "<String>" and "<section ...>" as tags, which no word comes from."""
    generic = remember(cast.alice.id, GENERIC)
    markup = remember(cast.alice.id, MARKUP)
    tea = remember(cast.alice.id, TEA)

    assert lexically(cast.alice.id, "String") == [generic]
    assert lexically(cast.alice.id, "section") == [markup]
    # A query written with the brackets reads the same words.
    assert lexically(cast.alice.id, "List<String>") == [generic]
    # A memory without brackets is analysed as before.
    assert lexically(cast.alice.id, "Darjeeling") == [tea]
    assert assert_consistent(cast.alice.id)["terms"][("default", "string")] == 1


def test_the_brackets_migration_analyses_older_documents_again_and_back(cast):
    from importlib import import_module

    brackets = import_module(BRACKETS)
    generic = remember(cast.alice.id, GENERIC)
    tea = remember(cast.alice.id, TEA)
    before = index_of(cast.alice.id)["documents"][("default", tea)]

    with connection.cursor() as cursor:
        cursor.execute(brackets.OLD)
    brackets.parts.reanalyse(None, Editor())
    assert ("default", "string") not in assert_consistent(cast.alice.id)["terms"]
    assert lexically(cast.alice.id, "String") == []
    untouched = written_by(tea)

    with connection.cursor() as cursor:
        cursor.execute(brackets.NEW)
    brackets.parts.reanalyse(None, Editor())
    index = assert_consistent(cast.alice.id)
    assert index["terms"][("default", "string")] == 1
    assert lexically(cast.alice.id, "String") == [generic]
    # A document whose words do not change is not written again.
    assert index["documents"][("default", tea)] == before
    assert written_by(tea) == untouched

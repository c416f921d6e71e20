"""Row-level security holds in the database, whatever the application code does."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.db.utils import ProgrammingError

from accounts.tiers import Tier
from core import tenancy
from memories import services


def raw_count(table: str = "memories") -> int:
    with connection.cursor() as cursor:
        # table is one of this module's own constant table names.
        cursor.execute(f"SELECT count(*) FROM {table}")  # noqa: S608
        return cursor.fetchone()[0]


@pytest.fixture
def two_tenants(cast):
    for n in range(3):
        services.remember(user_id=cast.alice.id, tier=Tier.PRO, content=f"alice {n}")
    services.remember(user_id=cast.charlie.id, tier=Tier.PRO, content="charlie 0")
    return cast


def test_a_raw_select_in_a_tenant_transaction_sees_only_that_tenant(two_tenants):
    with tenancy.tenant(two_tenants.alice.id):
        assert raw_count() == 3
    with tenancy.tenant(two_tenants.charlie.id):
        assert raw_count() == 1


def test_a_tenant_transaction_with_no_user_sees_nothing(two_tenants):
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL ROLE recall_app")
        assert raw_count() == 0
        cursor.execute("SET LOCAL ROLE NONE")


def test_the_owner_role_without_context_sees_nothing(two_tenants):
    # Django connects as the tables' owner; FORCE makes RLS bind it too.
    assert raw_count() == 0
    assert raw_count("api_keys") == 0


def test_the_operator_path_sees_every_tenant(two_tenants):
    with tenancy.operator():
        assert raw_count() == 4
        assert raw_count("api_keys") == 3


def test_a_write_for_another_tenant_is_refused_by_the_policy(two_tenants):
    with (
        pytest.raises(ProgrammingError, match="row-level security"),
        tenancy.tenant(two_tenants.alice.id),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "INSERT INTO memories (id, user_id, namespace, content, content_hash, embedding,"
            " embedding_model, metadata) VALUES (gen_random_uuid(), %s, 'default', 'x',"
            " 'h', '[1,0]', 'm', '{}')",
            [str(two_tenants.charlie.id)],
        )


def test_a_write_with_no_context_is_refused(two_tenants):
    with (
        pytest.raises(ProgrammingError, match="row-level security"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "INSERT INTO memories (id, user_id, namespace, content, content_hash, embedding,"
            " embedding_model, metadata) VALUES (gen_random_uuid(), %s, 'default', 'x',"
            " 'h', '[1,0]', 'm', '{}')",
            [str(two_tenants.alice.id)],
        )


def test_an_update_without_where_touches_only_the_tenants_rows(two_tenants):
    with tenancy.tenant(two_tenants.alice.id), connection.cursor() as cursor:
        cursor.execute("UPDATE memories SET metadata = '{\"wiped\": true}'")
        assert cursor.rowcount == 3
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM memories WHERE metadata ? 'wiped'")
        assert cursor.fetchone()[0] == 3


def test_the_tenant_role_cannot_read_users_or_change_key_tiers(two_tenants):
    with (
        pytest.raises(ProgrammingError, match="permission denied"),
        tenancy.tenant(two_tenants.alice.id),
        connection.cursor() as cursor,
    ):
        cursor.execute("SELECT email FROM users")
    with (
        pytest.raises(ProgrammingError, match="permission denied"),
        tenancy.tenant(two_tenants.alice.id),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE api_keys SET tier = 'team'")


def test_the_tenant_role_does_not_bypass_rls(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolbypassrls, rolcanlogin, rolsuper FROM pg_roles WHERE rolname = 'recall_app'"
        )
        assert cursor.fetchone() == (False, False, False)
        cursor.execute(
            "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class "
            "WHERE relname IN ('memories', 'api_keys', 'usage_events', 'forget_confirmations') "
            "ORDER BY relname"
        )
        assert cursor.fetchall() == [
            ("api_keys", True, True),
            ("forget_confirmations", True, True),
            ("memories", True, True),
            ("usage_events", True, True),
        ]


def test_the_context_ends_with_the_block(two_tenants):
    with tenancy.tenant(two_tenants.alice.id):
        assert tenancy.current() == f"tenant:{two_tenants.alice.id}"
    assert tenancy.current() is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user, current_setting('app.current_user_id', true)")
        role, setting = cursor.fetchone()
    assert role != "recall_app"
    assert not setting


def test_contexts_do_not_nest_across_identities(two_tenants):
    with tenancy.tenant(two_tenants.alice.id):
        with (
            pytest.raises(RuntimeError, match="cannot enter"),
            tenancy.tenant(two_tenants.charlie.id),
        ):
            pass
        with pytest.raises(RuntimeError, match="cannot enter"), tenancy.operator():
            pass


def show(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting(%s)", [name])
        return cursor.fetchone()[0]


def test_local_settings_last_for_the_block_only(two_tenants):
    with tenancy.tenant(two_tenants.alice.id, local_settings={"enable_seqscan": "off"}):
        assert show("enable_seqscan") == "off"
        assert raw_count() == 3
    assert show("enable_seqscan") == "on"

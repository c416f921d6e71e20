"""tenancy.TENANT_TABLES is complete: the list `recall doctor` and the architecture test rely on.

A table that holds a user's rows is either under forced row-level security,
and then in the list, or out of the tenant roles' reach altogether, so that
no tenant transaction can read another user's rows from it.
"""

from __future__ import annotations

from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import connection

from core import tenancy

TENANT_ROLES = [tenancy.APP_ROLE, tenancy.AGENT_ROLE]


def tables_with_a_user_column() -> set[str]:
    """Return the tables holding users' rows: a model's user foreign key, or a raw user_id."""
    user = get_user_model()
    modelled = {
        model._meta.db_table
        for model in apps.get_models()
        if any(
            field.concrete and field.is_relation and field.related_model is user
            for field in model._meta.get_fields()
        )
    }
    # Tables that migrations create in SQL (the search index) have no model.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.table_name FROM information_schema.columns c "
            "JOIN information_schema.tables t USING (table_schema, table_name) "
            "WHERE c.table_schema = current_schema() AND c.column_name = 'user_id' "
            "AND t.table_type = 'BASE TABLE'"
        )
        return modelled | {row[0] for row in cursor.fetchall()}


def forced_tables() -> dict[str, bool]:
    """Return every table with row-level security enabled or a policy: is it forced too?"""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, c.relrowsecurity AND c.relforcerowsecurity FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND "
            "(c.relrowsecurity OR EXISTS (SELECT 1 FROM pg_policies p "
            "WHERE p.schemaname = n.nspname AND p.tablename = c.relname))"
        )
        return dict(cursor.fetchall())


def reachable_by_tenant_roles(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r FROM unnest(%s::text[]) r WHERE has_table_privilege(r, %s, "
            "'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')",
            [TENANT_ROLES, table],
        )
        return [row[0] for row in cursor.fetchall()]


def test_every_tenant_table_is_forced_and_every_forced_table_is_listed(db):
    forced = forced_tables()

    assert set(forced) == set(tenancy.TENANT_TABLES)
    assert all(forced.values()), forced


def test_a_table_of_users_rows_outside_the_list_is_out_of_the_tenant_roles_reach(db):
    assert reachable_by_tenant_roles("memories") == TENANT_ROLES  # the probe sees grants
    for table in sorted(tables_with_a_user_column() - tenancy.TENANT_TABLES):
        assert reachable_by_tenant_roles(table) == [], table


def test_the_tenant_tables_are_the_users_tables(db):
    assert tables_with_a_user_column() >= tenancy.TENANT_TABLES

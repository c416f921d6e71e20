"""forget(mode="all"): empty one namespace, in two steps, touching nothing else."""

from __future__ import annotations

import pytest
from django.db import connection

from accounts.tiers import Tier
from core import tenancy
from core.errors import ConfirmationInvalid, ValidationFailed
from memories import services


def remember(user_id, content, namespace):
    return services.remember(user_id=user_id, tier=Tier.PRO, content=content, namespace=namespace)


def snapshot() -> set[tuple[str, str, str, str]]:
    """Every memory row in the database, as the operator sees it: (user, namespace, id, content)."""
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("SELECT user_id::text, namespace, id::text, content FROM memories")
        return set(cursor.fetchall())


@pytest.fixture
def neighbours(cast):
    """Alice's "work" namespace and everything around it that must survive emptying it."""
    for n in range(5):
        remember(cast.alice.id, f"work item {n}", "work")
    remember(cast.alice.id, "home item", "home")
    remember(cast.alice.id, "default item", "default")
    remember(cast.alice.id, "work item 0", "work-archive")  # same words, other namespace
    remember(cast.charlie.id, "Charlie's work item", "work")  # same namespace, other user
    return cast


def test_the_preview_counts_and_deletes_nothing(neighbours):
    before = snapshot()

    preview = services.forget_all_preview(user_id=neighbours.alice.id, namespace="work")

    assert preview["preview"] is True
    assert (preview["namespace"], preview["total_matches"]) == ("work", 5)
    assert preview["confirmation_token"]
    assert snapshot() == before


def test_confirming_deletes_exactly_that_namespace_of_that_user(neighbours):
    before = snapshot()
    token = services.forget_all_preview(user_id=neighbours.alice.id, namespace="work")[
        "confirmation_token"
    ]

    done = services.forget_confirm(user_id=neighbours.alice.id, confirmation_token=token)

    assert done == {"success": True, "deleted_count": 5}
    alice = str(neighbours.alice.id)
    expected = {row for row in before if not (row[0] == alice and row[1] == "work")}
    assert snapshot() == expected
    assert len(before - expected) == 5


def test_memories_stored_after_the_preview_are_kept(neighbours):
    token = services.forget_all_preview(user_id=neighbours.alice.id, namespace="work")[
        "confirmation_token"
    ]
    late = remember(neighbours.alice.id, "stored after the preview", "work")["id"]

    services.forget_confirm(user_id=neighbours.alice.id, confirmation_token=token)

    assert [
        m["id"] for m in services.list_memories(user_id=neighbours.alice.id, namespace="work")
    ] == [late]


def test_the_token_works_once_and_only_for_its_user(neighbours):
    token = services.forget_all_preview(user_id=neighbours.alice.id, namespace="work")[
        "confirmation_token"
    ]

    with pytest.raises(ConfirmationInvalid):
        services.forget_confirm(user_id=neighbours.charlie.id, confirmation_token=token)
    services.forget_confirm(user_id=neighbours.alice.id, confirmation_token=token)
    with pytest.raises(ConfirmationInvalid):
        services.forget_confirm(user_id=neighbours.alice.id, confirmation_token=token)
    assert services.count_namespace(user_id=neighbours.charlie.id, namespace="work") == 1


def test_the_namespace_must_be_named(cast):
    with pytest.raises(ValidationFailed, match="needs the namespace"):
        services.forget_all_preview(user_id=cast.alice.id, namespace=None)


def test_an_empty_namespace_gets_no_token(cast):
    preview = services.forget_all_preview(user_id=cast.alice.id, namespace="nothing-here")

    assert (preview["total_matches"], preview["confirmation_token"]) == (0, None)


def test_purge_on_the_preview_erases_the_history_on_confirmation(neighbours):
    preview = services.forget_all_preview(user_id=neighbours.alice.id, namespace="work", purge=True)
    ids = [m["id"] for m in services.list_memories(user_id=neighbours.alice.id, namespace="work")]

    done = services.forget_confirm(
        user_id=neighbours.alice.id, confirmation_token=preview["confirmation_token"]
    )

    assert done["purged"] is True
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM memory_history WHERE memory_id::text = ANY(%s)", [ids])
        assert cursor.fetchone()[0] == 0


def test_the_one_call_form_empties_only_that_namespace(neighbours):
    before = snapshot()

    done = services.forget_namespace(user_id=neighbours.alice.id, namespace="work")

    assert done["deleted_count"] == 5
    alice = str(neighbours.alice.id)
    assert snapshot() == {row for row in before if not (row[0] == alice and row[1] == "work")}


def test_even_a_raw_delete_on_the_tenant_path_cannot_reach_another_user(neighbours):
    # What _delete_namespace runs, minus its own user condition: the
    # row-level security policy alone keeps Charlie's "work" out of reach.
    with tenancy.tenant(neighbours.alice.id), connection.cursor() as cursor:
        cursor.execute("DELETE FROM memories WHERE namespace = 'work'")
        assert cursor.rowcount == 5

    assert services.count_namespace(user_id=neighbours.charlie.id, namespace="work") == 1


def test_a_token_confirms_only_with_the_mode_that_previewed_it(neighbours):
    alice = neighbours.alice.id
    everything = services.forget(user_id=alice, mode="all", namespace="work")["confirmation_token"]
    some = services.forget(user_id=alice, mode="by_query", query="work item", namespace="work")[
        "confirmation_token"
    ]
    before = snapshot()

    for token, other in ((everything, "by_query"), (some, "all")):
        with pytest.raises(ConfirmationInvalid, match=f'for mode "{other}"'):
            services.forget(user_id=alice, mode=other, confirmation_token=token)
    assert snapshot() == before  # refused, and nothing deleted

    # Each token still works with its own mode.
    assert services.forget(user_id=alice, mode="by_query", confirmation_token=some)["success"]
    done = services.forget(user_id=alice, mode="all", confirmation_token=everything)
    assert done["success"] and not any(
        row[1] == "work" and row[0] == str(alice) for row in snapshot()
    )

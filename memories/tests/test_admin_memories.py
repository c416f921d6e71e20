from __future__ import annotations

import logging

import pytest
from django.contrib.admin.models import DELETION, LogEntry

from accounts.models import User
from core import tenancy
from memories import services
from memories.models import Memory, MemoryHistory
from tests.support import store_memory

URL = "/admin/memories/memory/"
LONG = "The user prefers the Helix editor. " * 20  # 700 characters


def store(user: User, content: str, namespace: str = "default") -> Memory:
    return store_memory(user, content, namespace, embedding=(0.25, 0.5, 0.75))


@pytest.fixture
def memories(cast):
    return {
        "long": store(cast.alice, LONG, "prefs"),
        "work": store(cast.alice, "Alice works on Recall", "work"),
        "charlie": store(cast.charlie, "Charlie climbs", "default"),
    }


def test_the_list_truncates_content_and_never_shows_the_embedding(memories, admin_client):
    text = admin_client.get(URL).content.decode()

    assert LONG[:120] in text
    assert LONG[:121] not in text
    assert "0.25" not in text
    assert "Charlie climbs" in text


def test_the_detail_page_is_read_only_and_hides_the_embedding(memories, admin_client):
    response = admin_client.get(f"{URL}{memories['long'].id}/change/")

    text = response.content.decode()
    assert response.status_code == 200
    assert LONG[:121] not in text
    assert "0.25" not in text
    assert 'name="namespace"' not in text  # nothing is editable
    assert "Save" not in text


def test_it_filters_by_user_and_namespace(memories, admin_client):
    by_user = admin_client.get(URL, {"user_email": "ALICE@example.com"}).content.decode()
    by_both = admin_client.get(
        URL, {"user_email": "alice@example.com", "ns": "work"}
    ).content.decode()

    assert "Alice works on Recall" in by_user
    assert "Charlie climbs" not in by_user
    assert "Alice works on Recall" in by_both
    assert LONG[:40] not in by_both


def test_memories_cannot_be_added_or_changed(memories, admin_client):
    assert admin_client.get(f"{URL}add/").status_code == 403
    response = admin_client.post(
        f"{URL}{memories['work'].id}/change/", {"namespace": "moved", "content": "x"}
    )
    assert response.status_code == 403
    with tenancy.operator():
        assert Memory.objects.get(id=memories["work"].id).namespace == "work"


def test_deleting_a_memory_is_audited_without_its_content(memories, admin_client, caplog):
    memory = memories["work"]
    with caplog.at_level(logging.INFO, logger="memories"):
        response = admin_client.post(f"{URL}{memory.id}/delete/", {"post": "yes"})

    assert response.status_code == 302
    with tenancy.operator():
        assert not Memory.objects.filter(id=memory.id).exists()
    entry = LogEntry.objects.get(action_flag=DELETION)
    assert str(memory.id) in entry.object_repr
    assert "Recall" not in entry.object_repr
    [record] = [r for r in caplog.records if r.getMessage() == "memory deleted by operator"]
    assert record.memory_id == str(memory.id)
    assert record.user_id == str(memory.user_id)
    assert "Alice works on Recall" not in str(record.__dict__)
    # The memory's history says who: it read "system".
    with tenancy.operator():
        last = MemoryHistory.objects.filter(memory_id=memory.id).order_by("-version").first()
    assert last is not None and (last.action, last.client) == ("deleted", "admin")


def test_bulk_deletion_is_audited_too(memories, admin_client, caplog):
    ids = [str(memories["long"].id), str(memories["charlie"].id)]
    with caplog.at_level(logging.INFO, logger="memories"):
        admin_client.post(
            URL, {"action": "delete_selected", "_selected_action": ids, "post": "yes"}
        )

    with tenancy.operator():
        assert Memory.objects.filter(id__in=ids).count() == 0
        assert Memory.objects.filter(id=memories["work"].id).exists()
    audited = {
        r.memory_id for r in caplog.records if r.getMessage() == "memory deleted by operator"
    }
    assert audited == set(ids)
    assert LogEntry.objects.filter(action_flag=DELETION).count() == 2


def test_each_filter_box_keeps_the_others_value(memories, admin_client):
    text = admin_client.get(URL, {"user_email": "alice@example.com", "ns": "work"}).content.decode()

    assert '<input type="hidden" name="ns" value="work">' in text
    assert '<input type="hidden" name="user_email" value="alice@example.com">' in text


def test_deleting_the_middle_of_a_chain_in_the_admin_passes_it_on(cast, admin_client):
    # A plain delete let the key's SET NULL free A beside C: an outdated value current.
    def remember(content: str, **kwargs):
        return services.remember(user_id=cast.alice.id, tier="pro", content=content, **kwargs)

    first = remember("Staging Postgres runs on pg-staging-3.")["id"]
    middle = remember("Staging Postgres moved to pg-staging-7.", replaces=first)["id"]
    last = remember("Staging Postgres is now pg-staging-9.", replaces=middle)["id"]

    response = admin_client.post(f"{URL}{middle}/delete/", {"post": "yes"})

    assert response.status_code == 302
    with tenancy.operator():
        assert not Memory.objects.filter(id=middle).exists()
        assert str(Memory.objects.get(id=first).superseded_by) == last

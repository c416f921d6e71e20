"""The dashboard's history pages and the "Download my memories" export."""

from __future__ import annotations

import html
import json
import re

from accounts.tiers import Tier
from core import context
from memories import services


def remember(user, content, **kwargs):
    return services.remember(user_id=user.id, tier=Tier.PRO, content=content, **kwargs)["id"]


def test_a_memorys_history_page_shows_every_version_newest_first(cast, alice_client):
    with context.acting_as("mcp", cast.alice_key.key.id):
        memory_id = remember(cast.alice, "first wording")
        services.update_memory(user_id=cast.alice.id, id=memory_id, content="second wording")

    text = alice_client.get(f"/memories/{memory_id}/history/").content.decode()

    assert text.index("second wording") < text.index("first wording")
    assert "v2 updated" in text and "v1 created" in text
    assert cast.alice_key.key.prefix in text  # the key that made the change, by its prefix
    assert "alice laptop" in text


def test_a_history_page_shows_both_sides_of_a_link_and_who_decided(cast, alice_client):
    old = remember(cast.alice, "Staging Postgres runs on pg-staging-3.")
    new = remember(cast.alice, "Staging Postgres was migrated to pg-staging-7 last week.")

    older = alice_client.get(f"/memories/{old}/history/").content.decode()
    newer = alice_client.get(f"/memories/{new}/history/").content.decode()

    assert "v2 superseded" in older
    assert f'replaced by <a href="/memories/{new}/history/">' in older
    assert "decided by offline: same subject" in older
    assert f'replaces <a href="/memories/{old}/history/">' in newer


def test_the_memories_page_links_to_history_and_download(cast, alice_client):
    memory_id = remember(cast.alice, "linked")

    text = alice_client.get("/memories/").content.decode()

    assert f"/memories/{memory_id}/history/" in text
    assert "/memories/download/" in text and "Download my memories" in text


def test_another_users_history_is_a_404(cast, alice_client, charlie_client):
    memory_id = remember(cast.alice, "Alice's")

    assert charlie_client.get(f"/memories/{memory_id}/history/").status_code == 404


def test_deleting_from_the_dashboard_keeps_history_and_shows_it_as_a_change(cast, alice_client):
    memory_id = remember(cast.alice, "about to go")

    alice_client.post(f"/memories/{memory_id}/delete/")
    changes = alice_client.get("/memories/changes/").content.decode()
    history = alice_client.get(f"/memories/{memory_id}/history/").content.decode()

    assert "deleted" in changes and "about to go" in changes
    assert "by dashboard" in changes
    assert "This memory was deleted" in history


def test_erasing_a_deleted_memorys_history_leaves_nothing(cast, alice_client):
    memory_id = remember(cast.alice, "erase all trace")
    alice_client.post(f"/memories/{memory_id}/delete/")

    response = alice_client.post(f"/memories/{memory_id}/history/erase/")

    assert response.status_code == 302
    assert alice_client.get(f"/memories/{memory_id}/history/").status_code == 404
    assert "erase all trace" not in alice_client.get("/memories/changes/").content.decode()


def test_a_live_memorys_history_cannot_be_erased(cast, alice_client):
    memory_id = remember(cast.alice, "still here")

    alice_client.post(f"/memories/{memory_id}/history/erase/", follow=True)

    assert "still here" in alice_client.get(f"/memories/{memory_id}/history/").content.decode()


def test_delete_with_purge_erases_the_history_too(cast, alice_client):
    memory_id = remember(cast.alice, "gone for good")

    alice_client.post(f"/memories/{memory_id}/delete/", {"purge": "1"})

    assert alice_client.get(f"/memories/{memory_id}/history/").status_code == 404


def test_download_is_every_memory_as_json_lines_and_nothing_of_anyone_else(cast, alice_client):
    remember(cast.alice, "one", namespace="a")
    remember(cast.alice, "two", namespace="b", priority="high")
    remember(cast.charlie, "Charlie's")

    response = alice_client.get("/memories/download/")

    assert response["Content-Type"].startswith("application/x-ndjson")
    assert response["Content-Disposition"].startswith('attachment; filename="recall-memories-')
    assert response["Cache-Control"] == "no-store"
    records = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert sorted((r["namespace"], r["content"], r["priority"]) for r in records) == [
        ("a", "one", "medium"),
        ("b", "two", "high"),
    ]
    assert all(r["history"][0]["action"] == "created" for r in records)


def test_the_pages_need_a_signed_in_user(cast, client):
    assert client.get("/memories/download/").status_code == 302
    assert client.get("/memories/changes/").status_code == 302


def test_a_replaced_memorys_history_page_restores_it(cast, alice_client):
    old = remember(cast.alice, "The build server is ci-1.", namespace="infra")
    remember(cast.alice, "The build server is now ci-2.", namespace="infra", replaces=old)
    page = f"/memories/{old}/history/"

    text = alice_client.get(page).content.decode()
    restored = alice_client.post(f"/memories/{old}/restore/", {"next": page}, follow=True)

    assert "data-replaced" in text and f'action="/memories/{old}/restore/"' in text
    assert f'aria-label="Restore memory {old[:8]}"' in text
    assert restored.redirect_chain[-1][0] == page
    after = restored.content.decode()
    assert "Memory restored" in after and "data-replaced" not in after
    assert services.still_replaced(user_id=cast.alice.id, ids=[old]) == set()


def test_a_history_page_leads_back_to_its_memorys_namespace(cast, alice_client):
    current = remember(cast.alice, "Lunch is at noon.", namespace="team/notes")
    old = remember(cast.alice, "Standup is at 9.", namespace="team/notes")
    remember(cast.alice, "Standup is at 10 now.", namespace="team/notes", replaces=old)

    mine = alice_client.get(f"/memories/{current}/history/").content.decode()
    replaced = alice_client.get(f"/memories/{old}/history/").content.decode()

    assert 'href="/memories/?namespace=team%2Fnotes">← Memories' in mine
    # A replaced memory is listed only with "Show replaced" ticked.
    assert 'href="/memories/?namespace=team%2Fnotes&amp;replaced=1">← Memories' in replaced


def test_a_replacing_memory_whose_history_was_erased_is_named_not_linked(cast, alice_client):
    old = remember(cast.alice, "The VPN endpoint is vpn-a.")
    new = remember(cast.alice, "The VPN endpoint moved to vpn-b.", replaces=old)
    alice_client.post(f"/memories/{new}/delete/", {"purge": "1"})
    assert alice_client.get(f"/memories/{new}/history/").status_code == 404

    text = alice_client.get(f"/memories/{old}/history/").content.decode()

    assert "v2 superseded" in text
    assert f"/memories/{new}/history/" not in text
    assert f'data-erased="{new}"' in text and "its history erased" in text


def test_recent_changes_pages_back_through_older_ones(cast, alice_client):
    # It showed the latest 50 and said older ones were "not listed here".
    from dashboard.views import HISTORY_PAGE
    from tests.support import store_memory

    for n in range(HISTORY_PAGE):
        store_memory(cast.alice, f"change {n}")

    full = alice_client.get("/memories/changes/").content.decode()
    store_memory(cast.alice, "one change more")
    over = alice_client.get("/memories/changes/").content.decode()
    older = alice_client.get("/memories/changes/?" + _link(over, "Older")).content.decode()

    assert f"{HISTORY_PAGE} a page" in full and "data-more" not in full
    assert full.count("data-memory-id") == HISTORY_PAGE
    assert over.count("data-memory-id") == HISTORY_PAGE and "data-more" in over
    assert "Newer" not in over
    # The oldest change, the first stored, is alone on the second page.
    assert older.count("data-memory-id") == 1 and "change 0" in older
    assert "data-more" not in older
    newest = alice_client.get("/memories/changes/?" + _link(older, "Newer")).content.decode()
    assert _shown(newest) == _shown(over)
    for mangled in ("x", "1.2.3", "-1", "", "1." + "9" * 19, "9" * 18 + ".1"):
        page = alice_client.get(f"/memories/changes/?before={mangled}")
        assert page.status_code == 200 and _shown(page.content.decode()) == _shown(over)
    # Older than every change (a link kept past the retention purge): said so,
    # with the way back to the latest.
    past = alice_client.get("/memories/changes/?before=0.1")
    assert past.status_code == 200 and "No older changes" in past.content.decode()
    assert 'href="?"' in past.content.decode() and "Newer" not in past.content.decode()
    # A page newer than every change is the latest page.
    ahead = alice_client.get("/memories/changes/?after=" + "9" * 17 + ".1").content.decode()
    assert _shown(ahead) == _shown(over) and "No older changes" not in ahead


def test_changes_recorded_meanwhile_shift_no_page_and_ties_are_kept_apart(cast, alice_client):
    # Paged by offset, a change recorded between two pages showed the last row
    # of one page again at the top of the next; many changes of one statement
    # share their recorded_at, which the pages must still tell apart.
    from core import tenancy
    from dashboard.views import HISTORY_PAGE
    from memories.models import Memory
    from tests.support import store_memory

    total = 2 * HISTORY_PAGE + 20
    with tenancy.tenant(cast.alice.id):
        Memory.objects.bulk_create(
            Memory(
                user=cast.alice,
                namespace="default",
                content=f"batch {n}",
                content_hash=f"{n:064x}",
                embedding=[1.0, 0.0],
                embedding_model="t",
            )
            for n in range(total)
        )

    seen: list[str] = []
    page = alice_client.get("/memories/changes/").content.decode()
    seen += _shown(page)
    while "data-more" in page:
        store_memory(cast.alice, f"recorded meanwhile {len(seen)}")
        page = alice_client.get("/memories/changes/?" + _link(page, "Older")).content.decode()
        seen += _shown(page)

    assert len(seen) == total and len(set(seen)) == total
    assert "No older changes" not in page and "recorded meanwhile" not in " ".join(seen)
    # Back from the oldest page: the page before it, not the newest changes.
    back = alice_client.get("/memories/changes/?" + _link(page, "Newer")).content.decode()
    assert _shown(back) == seen[HISTORY_PAGE : 2 * HISTORY_PAGE]


def _link(page: str, label: str) -> str:
    """The query string of the page's pager link named ``label``."""
    found = re.search(r'href="\?([^"]+)"[^>]*>[^<]*' + label, page)
    assert found is not None, label
    return html.unescape(found[1])


def _shown(page: str) -> list[str]:
    """The contents the page lists, in order."""
    return re.findall(r'<div class="content">([^<]*)</div>', page)


def test_a_cursor_does_not_show_the_count_every_users_changes_share(cast, alice_client):
    """review134: the cursor carried the history row's id, a sequence all users share:
    two of Alice's cursors told how many changes others made between them."""
    from core import tenancy
    from dashboard.views import HISTORY_PAGE
    from memories.models import MemoryHistory
    from tests.support import store_memory

    for n in range(HISTORY_PAGE + 1):
        store_memory(cast.alice, f"change {n}")
    page = alice_client.get("/memories/changes/").content.decode()
    cursor = _link(page, "Older").removeprefix("before=")
    with tenancy.operator():
        ids = list(
            MemoryHistory.objects.filter(user=cast.alice)
            .order_by("-recorded_at", "-id")
            .values_list("id", flat=True)
        )

    micros, hidden = cursor.split(".")
    assert int(hidden) not in ids
    # The same row, the same cursor: it still pages (the earlier tests).
    again = alice_client.get("/memories/changes/").content.decode()
    assert _link(again, "Older") == f"before={micros}.{hidden}"
    older = alice_client.get(f"/memories/changes/?before={cursor}").content.decode()
    assert _shown(older) == ["change 0"]


def test_erasing_a_live_memorys_history_says_what_the_page_offers_instead(cast, alice_client):
    # review140: the refusal said "forget it with purge", which no dashboard button did.
    memory_id = remember(cast.alice, "still here", namespace="work")

    response = alice_client.post(f"/memories/{memory_id}/history/erase/", follow=True)

    page = response.content.decode()
    assert "forget it with purge" not in page
    assert "cannot be erased on its own" in page and "Delete and erase history" in page
    form = re.search(
        rf'<form method="post" action="/memories/{memory_id}/delete/"[^>]*>(.*?)</form>',
        page,
        re.S,
    )
    assert form is not None
    assert '<input type="hidden" name="purge" value="1">' in form.group(1)
    assert '<input type="hidden" name="next" value="/memories/?namespace=work">' in form.group(1)

    done = alice_client.post(
        f"/memories/{memory_id}/delete/", {"purge": "1", "next": "/memories/?namespace=work"}
    )

    assert done["Location"] == "/memories/?namespace=work"
    assert alice_client.get(f"/memories/{memory_id}/history/").status_code == 404

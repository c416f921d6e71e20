from __future__ import annotations

import html
import json
import re

import pytest
from django.db import connection
from django.test import Client

from accounts.models import Agent
from accounts.tiers import Tier
from core import tenancy
from memories import services
from memories.models import Memory
from tests.support import store_memory

URL = "/memories/"
FRAMEWORKS = (
    "The user prefers Python for data analysis and prefers FastAPI over Flask for web services."
)


def listed(response) -> list[str]:
    return re.findall(r'data-memory-id="([^"]+)"', response.content.decode())


def test_it_lists_a_namespace_newest_first(cast, alice_client):
    first = store_memory(cast.alice, "first note")
    second = store_memory(cast.alice, "second note")
    store_memory(cast.alice, "elsewhere", namespace="work")

    response = alice_client.get(URL)

    assert listed(response) == [str(second.id), str(first.id)]
    text = response.content.decode()
    assert "default (2)" in text and "work (1)" in text


@pytest.mark.parametrize(
    "query",
    [{"offset": "1000001"}, {"namespace": "bad ns"}, {"q": "x", "namespace": "bad ns"}],
    ids=["offset", "namespace", "search"],
)
def test_a_refused_filter_shows_its_error_and_no_empty_state_beside_it(cast, alice_client, query):
    # "Every memory here was replaced" or "This namespace is empty" stood under the
    # error, though the namespace held current memories.
    store_memory(cast.alice, "a current note")

    page = alice_client.get(URL, query).content.decode()

    assert '<p class="notice error">' in page
    for empty in ("Nothing here", "Nothing matches", "No more memories here", "No memories yet"):
        assert empty not in page


def test_it_filters_by_namespace(cast, alice_client):
    work = store_memory(cast.alice, "a work note", namespace="work")
    store_memory(cast.alice, "a default note")

    assert listed(alice_client.get(URL, {"namespace": "work"})) == [str(work.id)]


def test_a_namespace_named_in_the_link_but_empty_is_the_one_the_list_shows(cast, alice_client):
    # The list had no option for it, so the browser showed "default" selected
    # above the empty page of another namespace.
    store_memory(cast.alice, "a default note")

    page = alice_client.get(URL, {"namespace": "travel"}).content.decode()

    selected = re.findall(r'<option value="([^"]*)" selected>', page)
    assert selected == ["travel"]
    assert "This namespace is empty" in page
    assert '<option value="default" >default (1)</option>' in page


def test_it_pages_through_long_namespaces(cast, alice_client):
    for n in range(25):
        store_memory(cast.alice, f"note {n}")

    first = alice_client.get(URL)
    second = alice_client.get(URL, {"offset": 20})

    assert len(listed(first)) == 20
    assert len(listed(second)) == 5
    assert not set(listed(first)) & set(listed(second))
    assert "offset=20" in first.content.decode()


def test_past_the_end_of_a_namespace_it_says_so_and_leads_back(cast, alice_client):
    # Deleting the last memory of the last page came back to that page,
    # which said the namespace was empty, with no way back.
    for n in range(21):
        store_memory(cast.alice, f"note {n}")

    page = alice_client.get(URL, {"offset": 40}).content.decode()

    assert "No more memories here" in page and "This namespace is empty" not in page
    assert "First page" in page


def test_it_searches_by_meaning(cast, alice_client):
    services.remember(user_id=cast.alice.id, tier=Tier.FREE, content=FRAMEWORKS)
    services.remember(user_id=cast.alice.id, tier=Tier.FREE, content="The cat is called Miso.")

    response = alice_client.get(URL, {"q": "What web framework does the user prefer?"})

    text = response.content.decode()
    assert "FastAPI" in text
    assert "Miso" not in text
    assert "similarity" in text


def test_a_lone_match_shows_its_absolute_score(cast, alice_client):
    services.remember(
        user_id=cast.alice.id, tier=Tier.FREE, content="The lake house wifi password is heron-42."
    )

    text = alice_client.get(URL, {"q": "wifi password"}).content.decode()

    # Min-max scoring showed a lone match as 0.00.
    [shown] = re.findall(r'data-score="([0-9.]+)"', text)
    assert float(shown) >= 0.5
    assert "0.5 as likely relevant as not" in text


def test_content_is_escaped(cast, alice_client):
    store_memory(cast.alice, "<script>alert('x')</script>")

    text = alice_client.get(URL).content.decode()

    assert "<script>alert" not in text
    assert "&lt;script&gt;" in text


def test_a_bidirectional_control_in_content_is_shown_as_a_mark_not_obeyed(cast, alice_client):
    # "Pay <RLO>0001$ ot<PDF> Bob" read "Pay to$ 1000 Bob"-style on the page: the
    # override reordered what was shown.
    store_memory(cast.alice, "Approve refunds up to \u202e0001$\u202c <b>only</b>.")

    text = alice_client.get(URL).content.decode()

    assert "\u202e" not in text and "\u202c" not in text
    assert '<span class="control" title="RIGHT-TO-LEFT OVERRIDE">U+202E</span>' in text
    assert '<span class="control" title="POP DIRECTIONAL FORMATTING">U+202C</span>' in text
    assert "&lt;b&gt;only&lt;/b&gt;" in text  # escaped all the same


def test_a_bidirectional_control_in_metadata_or_a_role_is_shown_as_a_mark(cast, alice_client):
    services.remember(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        messages=[{"role": "user\u202e", "content": "Refunds need two approvals."}],
        metadata={"note": "up to \u2067<i>5</i>\u2069"},
    )

    text = alice_client.get(URL).content.decode()

    assert not {"\u202e", "\u2067", "\u2069"} & set(text)
    assert '<span class="control" title="RIGHT-TO-LEFT OVERRIDE">U+202E</span>' in text
    assert 'title="RIGHT-TO-LEFT ISOLATE">U+2067</span>' in text
    assert "&lt;i&gt;5&lt;/i&gt;" in text


def test_it_deletes_a_memory(cast, alice_client):
    memory = store_memory(cast.alice, "forget me")

    response = alice_client.post(f"/memories/{memory.id}/delete/", {"next": "/memories/?x=1"})

    assert response.status_code == 302
    assert response["Location"] == "/memories/?x=1"
    with tenancy.operator():
        assert not Memory.objects.filter(id=memory.id).exists()


def test_it_never_redirects_off_site_after_a_delete(cast, alice_client):
    memory = store_memory(cast.alice, "forget me")

    response = alice_client.post(
        f"/memories/{memory.id}/delete/", {"next": "https://evil.example/"}
    )

    assert response["Location"] == "/memories/"


def test_charlie_never_sees_or_deletes_alices_memories(cast, alice_client, charlie_client):
    services.remember(user_id=cast.alice.id, tier=Tier.FREE, content="Alice's door code is 4512")
    with tenancy.tenant(cast.alice.id):
        memory = Memory.objects.get(user=cast.alice)

    assert "4512" not in charlie_client.get(URL).content.decode()
    assert "4512" not in charlie_client.get(URL, {"q": "door code"}).content.decode()
    refused = charlie_client.post(f"/memories/{memory.id}/delete/", follow=True)
    assert "is not among yours" in refused.content.decode()
    with tenancy.operator():
        assert Memory.objects.filter(id=memory.id).exists()


def test_with_no_memories_it_explains_what_to_do(cast, alice_client):
    text = alice_client.get(URL).content.decode()

    assert "No memories yet" in text
    assert "remember" in text
    assert "/mcp" in text


def test_deleting_is_csrf_protected(cast):
    memory = store_memory(cast.alice, "keep me")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(cast.alice)

    assert strict.post(f"/memories/{memory.id}/delete/").status_code == 403


@pytest.mark.parametrize("offset", ["-5", "x"])
def test_a_bad_offset_starts_at_the_top(cast, alice_client, offset):
    store_memory(cast.alice, "only note")

    assert len(listed(alice_client.get(URL, {"offset": offset}))) == 1


def agents_shown(response) -> dict[str, str]:
    """Map each listed memory's id to the agent the page says wrote it ("" for none)."""
    text = response.content.decode()
    return dict(re.findall(r'data-memory-id="([^"]+)".*?data-agent="([^"]*)"', text, flags=re.S))


def test_it_shows_which_agent_wrote_each_memory(cast, agents, alice_client):
    mine = store_memory(cast.alice, "written with a user-wide key")
    research = store_memory(cast.alice, "found by research", agent=agents.research)

    response = alice_client.get(URL)

    assert agents_shown(response) == {str(research.id): "research", str(mine.id): ""}
    assert "no agent" in response.content.decode()


def test_it_filters_by_agent_when_listing_and_searching(cast, agents, alice_client):
    def remember(content: str, agent: Agent | None = None) -> str:
        stored = services.remember(
            user_id=cast.alice.id,
            tier=Tier.PRO,
            content=content,
            agent_id=agent.id if agent else None,
        )
        return str(stored["id"])

    remember("The writer's draft says the launch is on Friday.", agents.writer)
    research = remember("Research found the launch moved to Monday.", agents.research)
    remember("A user-wide note: the launch party is at noon.")

    listed_page = alice_client.get(URL, {"agent": str(agents.research.id)})
    searched = alice_client.get(URL, {"agent": str(agents.research.id), "q": "when is the launch?"})
    unknown = alice_client.get(URL, {"agent": str(agents.helper.id)})  # Charlie's agent

    assert listed(listed_page) == [research]
    assert listed(searched) == [research]
    assert len(listed(unknown)) == 3  # not one of Alice's agents: no filter
    text = listed_page.content.decode()
    assert f'<option value="{agents.research.id}" selected>research</option>' in text
    assert f"agent={agents.research.id}" in text  # kept by the Clear link and the pager


def test_metadata_is_shown_as_json(cast, alice_client):
    store_memory(
        cast.alice, "tagged", metadata={"source": "slack", "done": True, "tags": ["a", "b"]}
    )

    text = alice_client.get(URL).content.decode()

    [shown] = re.findall(r"data-metadata>([^<]+)<", text)
    assert json.loads(html.unescape(shown)) == {"source": "slack", "done": True, "tags": ["a", "b"]}
    assert "True" not in shown and "'" not in html.unescape(shown)


def test_search_is_described_as_words_and_meaning(cast, alice_client):
    text = alice_client.get(URL).content.decode()

    assert "words and meaning together" in text
    assert "by meaning, not exact words" not in text
    assert "Search by meaning" not in text


def test_replaced_memories_are_hidden_unless_asked_and_link_both_ways(cast, alice_client):
    old = services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="The office wifi password is tulip-42."
    )["id"]
    new = services.remember(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        content="New office wifi password: orchid-77.",
        replaces=old,
    )["id"]

    assert listed(alice_client.get(URL)) == [new]
    assert listed(alice_client.get(URL, {"q": "wifi password"})) == [new]
    shown = alice_client.get(URL, {"replaced": "1"})
    assert listed(shown) == [new, old]
    text = shown.content.decode()
    assert f'data-superseded-by="{new}"' in text
    assert f'data-replaces="{old}"' in text
    assert f"/memories/{old}/restore/" in text
    assert f"/memories/{new}/restore/" not in text  # only a replaced memory has the button
    assert old in listed(alice_client.get(URL, {"q": "wifi password", "replaced": "1"}))


def test_a_search_marks_an_older_memory_a_newer_one_likely_restates(cast, alice_client):
    older = services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="Cormac works at Brackenfield."
    )["id"]
    newer = services.remember(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        content="Cormac is a staff engineer at Marlowe Robotics.",
    )["id"]

    searched = alice_client.get(URL, {"q": "Which company employs Cormac?"})
    browsed = alice_client.get(URL).content.decode()

    assert listed(searched)[:2] == [newer, older]
    assert f'data-may-be-replaced-by="{newer}"' in searched.content.decode()
    assert "data-may-be-replaced-by" not in browsed  # only a search compares results

    # The "Replaced" button agrees with the mark: the older leaves the search.
    back = f"{URL}?q=Which+company+employs+Cormac%3F"
    response = alice_client.post(f"/memories/{older}/link/", {"by": newer, "next": back})
    assert response.status_code == 302 and response.url == back
    assert listed(alice_client.get(back)) == [newer]
    with tenancy.operator():
        assert str(Memory.objects.get(id=older).superseded_by) == newer
    # Charlie cannot link Alice's memories: they do not exist for him.
    charlie = Client()
    charlie.force_login(cast.charlie)
    refused = charlie.post(f"/memories/{older}/link/", {"by": newer}, follow=True)
    assert "no longer exists" in refused.content.decode()
    # Alice's own memory named as replaced by one of Charlie's: the message
    # does not say hers is gone.
    theirs = services.remember(user_id=cast.charlie.id, tier=Tier.PRO, content="x")["id"]
    refused = alice_client.post(f"/memories/{older}/link/", {"by": theirs}, follow=True)
    assert "or the one said to replace it no longer exists here" in refused.content.decode()
    # A wrong pair is refused with the reason, and nothing changes.
    refused = alice_client.post(f"/memories/{newer}/link/", {"by": newer}, follow=True)
    assert "cannot replace itself" in refused.content.decode()


def test_the_restore_button_makes_a_replaced_memory_current(cast, alice_client):
    old = services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="Gym is on Elm St.")["id"]
    services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="Gym moved to Oak St.", replaces=old
    )

    response = alice_client.post(f"/memories/{old}/restore/", {"next": URL})

    assert response.status_code == 302
    assert old in listed(alice_client.get(URL))
    with tenancy.operator():
        assert Memory.objects.get(id=old).superseded_by is None
    # Charlie cannot restore Alice's memory: it does not exist for him.
    charlie = Client()
    charlie.force_login(cast.charlie)
    refused = charlie.post(f"/memories/{old}/restore/", follow=True)
    assert "is not among yours" in refused.content.decode()


def test_deleting_a_replacement_says_the_memory_it_replaced_is_current_again(cast, alice_client):
    old = services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="Gym is on Elm St.")["id"]
    new = services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="Gym moved to Oak St.", replaces=old
    )["id"]

    page = alice_client.post(f"/memories/{new}/delete/", {"next": URL}, follow=True)

    assert "The memory it replaced is current again." in page.content.decode()
    assert listed(page) == [old]
    # A stale page's button on a memory deleted since: a message, not an error page.
    again = alice_client.post(f"/memories/{new}/restore/", {"next": URL}, follow=True)
    assert again.status_code == 200 and "is not among yours" in again.content.decode()


def test_deleting_the_middle_of_a_chain_says_the_memory_it_replaced_stays_replaced(
    cast, alice_client
):
    def remember(content: str, replaces: str | None = None) -> str:
        return services.remember(
            user_id=cast.alice.id, tier=Tier.PRO, content=content, replaces=replaces
        )["id"]

    first = remember("Gym is on Elm St.")
    middle = remember("Gym moved to Oak St.", first)
    last = remember("Gym is now on Pine St.", middle)

    page = alice_client.post(f"/memories/{middle}/delete/", {"next": URL}, follow=True)

    text = page.content.decode()
    assert "current again" not in text
    assert "The memory it replaced stays replaced" in text
    assert listed(page) == [last]


def test_a_namespace_counts_its_current_memories_and_says_when_all_were_replaced(
    cast, alice_client
):
    old = services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="Gym is on Elm St.")["id"]
    services.remember(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        content="Gym moved to Oak St.",
        replaces=old,
        ttl_seconds=60,
        namespace="default",
    )
    text = alice_client.get(URL).content.decode()
    assert "default (1 + 1 replaced)" in text
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memories SET expires_at = statement_timestamp() - interval '1 second'"
            " WHERE superseded_by IS NULL"
        )

    # The replacing memory expired, unpurged: the old one is still replaced.
    text = alice_client.get(URL).content.decode()
    assert "default (0 + 1 replaced)" in text
    assert "Tick <em>Show replaced</em> to see it." in text


def test_the_replaced_button_refuses_a_memory_older_than_the_one_it_would_replace(
    cast, alice_client
):
    older = services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="Cormac works at Brackenfield."
    )["id"]
    newer = services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="Cormac is a staff engineer at Marlowe."
    )["id"]

    refused = alice_client.post(f"/memories/{newer}/link/", {"by": older}, follow=True)

    text = html.unescape(refused.content.decode())
    assert f"Memory {older} is older than memory {newer}" in text
    assert "only a later memory can replace an earlier one" in text
    assert "data-restores" not in text  # nothing to undo
    with tenancy.operator():
        assert Memory.objects.get(id=newer).superseded_by is None
        assert Memory.objects.get(id=older).superseded_by is None
    # The other way round is what the button is for.
    alice_client.post(f"/memories/{older}/link/", {"by": newer})
    with tenancy.operator():
        assert str(Memory.objects.get(id=older).superseded_by) == newer


def test_the_replaced_message_offers_the_memorys_restore_button(cast, alice_client):
    older = services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="Cormac works at Brackenfield."
    )["id"]
    newer = services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="Cormac is a staff engineer at Marlowe."
    )["id"]
    back = f"{URL}?q=Cormac"

    page = alice_client.post(f"/memories/{older}/link/", {"by": newer, "next": back}, follow=True)

    text = page.content.decode()
    assert "Marked as replaced" in text
    message = re.search(r'<ul class="messages">(.*?)</ul>', text, re.S)[1]
    assert f'action="/memories/{older}/restore/"' in message
    assert 'name="csrfmiddlewaretoken"' in message
    assert f'value="{html.escape(back)}"' in message or f'value="{back}"' in message
    assert f'aria-label="Restore memory {older[:8]}"' in message
    # Shown once: the next page has no message and no button.
    assert "data-restores" not in alice_client.get(back).content.decode()
    restored = alice_client.post(f"/memories/{older}/restore/", {"next": back}, follow=True)
    assert "Memory restored" in restored.content.decode()
    assert older in listed(restored)


def test_each_memorys_buttons_say_which_memory_they_act_on(cast, alice_client):
    old = services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="Gym is on Elm St.")["id"]
    services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="Gym moved to Oak St.", replaces=old
    )

    text = alice_client.get(URL, {"replaced": "1"}).content.decode()

    assert 'aria-label="Delete: Gym is on Elm St."' in text
    assert 'aria-label="Delete: Gym moved to Oak St."' in text
    assert 'aria-label="Restore: Gym is on Elm St."' in text


def test_every_page_starts_with_a_link_past_the_navigation(cast, alice_client, client):
    signed_in = alice_client.get(URL).content.decode()
    sign_in = client.get("/login/").content.decode()

    for text in (signed_in, sign_in):
        assert '<a class="skip-link" href="#content">Skip to content</a>' in text
        assert text.index("skip-link") < text.index('id="content"')
    assert signed_in.index('class="nav"') < signed_in.index('<main id="content"')


def test_a_search_says_when_it_stopped_at_a_page_of_results(cast, alice_client, settings):
    from dashboard.views import PAGE_SIZE

    settings.RECALL_SUPERSESSION = "off"  # each a fact of its own, none replacing another
    for n in range(PAGE_SIZE):
        services.remember(
            user_id=cast.alice.id, tier=Tier.PRO, content=f"Kestrel crate {n} holds {n} apples."
        )

    services.remember(
        user_id=cast.alice.id, tier=Tier.PRO, content="Kestrel crate 1 holds pears.", namespace="b"
    )

    full = alice_client.get(URL, {"q": "Kestrel crate apples"}).content.decode()
    browsed = alice_client.get(URL).content.decode()
    few = alice_client.get(URL, {"q": "Kestrel crate apples", "namespace": "b"}).content.decode()

    assert full.count("data-memory-id") == PAGE_SIZE
    assert "data-limited" in full and "there may be more" in full
    assert "data-limited" not in browsed  # a list has its pager instead
    assert few.count("data-memory-id") == 1 and "data-limited" not in few


def test_a_long_memory_is_listed_as_a_preview_with_the_whole_one_click_away(cast, alice_client):
    # review140: a 50,000-character memory was listed in full (a page 25,577 px tall).
    long = "".join(f"word{n} " for n in range(8000))[:50_000]
    store_memory(cast.alice, long)
    store_memory(cast.alice, "A short note.")

    page = alice_client.get(URL).content.decode()

    [preview] = re.findall(r'<div class="content preview" data-preview>([^<]*)</div>', page)
    assert len(html.unescape(preview)) == 600 and preview.endswith("…")  # views.PREVIEW_CHARS
    assert long.startswith(html.unescape(preview)[:-1])
    whole = re.search(
        r'<details class="whole"><summary>Show all 50000 characters</summary>'
        r'<div class="content">([^<]*)</div></details>',
        page,
    )
    assert whole is not None and html.unescape(whole.group(1)) == long
    assert '<div class="content">A short note.</div>' in page  # a short one as it is
    # The history page shows it whole, as it always did.
    memory_id = listed(alice_client.get(URL))[-1]
    history = alice_client.get(f"/memories/{memory_id}/history/").content.decode()
    assert "data-preview" not in history and html.escape(long) in history


def test_a_search_has_no_pager_and_ignores_an_offset(cast, alice_client, settings):
    # review140: a search showed "← Newer" at ?offset=20, to a link without its query;
    # a search is one page of the best matches.
    from dashboard.views import PAGE_SIZE

    settings.RECALL_SUPERSESSION = "off"
    for n in range(PAGE_SIZE + 5):
        services.remember(
            user_id=cast.alice.id, tier=Tier.PRO, content=f"Crate {n} holds {n} apples."
        )

    first = alice_client.get(URL, {"q": "apples"})
    later = alice_client.get(URL, {"q": "apples", "offset": PAGE_SIZE})

    for response in (first, later):
        text = response.content.decode()
        assert 'class="pager"' not in text and "Newer" not in text and "Older" not in text
        assert "data-limited" in text
    assert listed(later) == listed(first)


def test_a_long_memory_of_combining_marks_is_previewed_once_not_shown_twice(cast, alice_client):
    # review149: truncatechars does not count combining marks, so 1,200 code points of
    # "x" and two accents came back whole: the memory was listed twice over.
    marked = "x\u0301\u0302" * 400
    store_memory(cast.alice, marked)

    page = alice_client.get(URL).content.decode()

    [preview] = re.findall(r'<div class="content preview" data-preview>([^<]*)</div>', page)
    shown = html.unescape(preview)
    assert len(shown) == 600 and shown.endswith("…")  # views.PREVIEW_CHARS, in code points
    assert marked.startswith(shown[:-1])
    assert "Show all 1200 characters" in page
    assert page.count(marked) == 1  # only behind "Show all"

"""Each row's button or link says, to a screen reader, which row it acts on (review140).

A list of twenty links all named "history", or of buttons all named "Revoke",
gives a screen reader's list of links or buttons nothing to choose by. Each
name starts with the words shown, then says which key, agent or memory.
"""

from __future__ import annotations

import html
import re

from tests.support import store_memory


def names(page: str, element: str, shown: str) -> list[str]:
    """The aria-label of each ``element`` whose visible text starts with ``shown``."""
    found = re.findall(rf'<{element}\b[^>]*aria-label="([^"]*)"[^>]*>{shown}', page)
    return [html.unescape(name) for name in found]


def test_each_revoke_button_names_its_key_and_not_its_secret(cast, alice_client):
    page = alice_client.get("/keys/").content.decode()

    said = names(page, "button", "Revoke")
    prefixes = {cast.alice_key.key.prefix, cast.bob_key.key.prefix}
    assert sorted(said) == sorted(
        [
            f"Revoke key alice laptop ({cast.alice_key.key.prefix}…)",
            f"Revoke key bob's agent ({cast.bob_key.key.prefix}…)",
        ]
    )
    assert len(prefixes) == 2
    for key in (cast.alice_key, cast.bob_key):
        assert key.raw not in page


def test_each_agents_delete_button_names_its_agent(cast, agents, alice_client):
    page = alice_client.get("/agents/").content.decode()

    assert sorted(names(page, "button", "Delete")) == [
        "Delete agent research",
        "Delete agent writer",
    ]


def test_each_history_link_names_its_memory(cast, alice_client):
    store_memory(cast.alice, "The user's bike is red.")
    store_memory(cast.alice, "The user drinks oat milk in coffee, never cow's milk at all.")

    page = alice_client.get("/memories/").content.decode()

    assert names(page, "a", "history") == [
        "history: The user drinks oat milk in coffee, nev…",
        "history: The user's bike is red.",
    ]

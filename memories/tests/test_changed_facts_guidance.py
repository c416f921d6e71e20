"""What agents are told to do when a fact changes: one answer, on every endpoint (review145).

A changed fact is stored anew with ``replaces``, so the old value stays as a
memory of its own, marked replaced and restorable; ``update_memory`` corrects
a memory in place. The server's instructions once sent changed facts to
``update_memory``, and its description said so too, against ``remember``'s.
"""

from __future__ import annotations

import re

from django.conf import settings

from memories.mcp import agent_tools, server, tools, v1_tools


def flat(text: str | None) -> str:
    return re.sub(r"\s+", " ", text or "")


def described(catalogue: list, name: str) -> str:
    for fn, _annotations in catalogue:
        if fn.__name__ == name:
            return flat(fn.__doc__)
    raise AssertionError(f"no tool {name}")


def test_the_mcp_instructions_send_a_changed_fact_to_remember_with_replaces():
    said = flat(server.INSTRUCTIONS)
    assert "`update_memory` when a fact changes" not in said
    assert re.search(r"fact changes.*`remember`.*`replaces`", said)
    assert re.search(r"`update_memory`[^.]*correct", said)


def test_update_memory_is_for_corrections_and_points_changed_facts_to_replaces():
    update = described(tools.TOOLS, "update_memory")
    assert "Use this when a remembered fact changes" not in update
    assert "rather than storing a contradicting memory" not in update
    assert "correct" in update.lower()
    assert re.search(r"fact changes.*remember.*replaces", update)
    remember = described(tools.TOOLS, "remember")
    assert "When a fact changes, store the new one" in remember


def test_the_v1_tools_say_the_same():
    said = flat(v1_tools.INSTRUCTIONS)
    assert re.search(r"changed.*add_memory.*replaces|add_memory.*replaces.*changed", said)
    assert re.search(r"update_memory[^.;]*correct", said)
    update = described(v1_tools.TOOLS, "update_memory")
    assert update.startswith("Modify an existing memory")  # the seed's word for it
    assert re.search(r"changed.*add_memory.*replaces", update)


def test_the_agent_tools_store_a_changed_fact_as_a_new_note():
    add = described(agent_tools.TOOLS, "memory_add")
    assert "replaces names the old memory" in add
    assert "update" not in flat(agent_tools.INSTRUCTIONS).lower()


def changes_section() -> str:
    readme = (settings.BASE_DIR / "README.md").read_text()
    return flat(readme.split("### When facts change", 1)[1].split("\n### ", 1)[0])


def test_the_readme_keeps_update_memory_for_corrections():
    section = changes_section()
    assert re.search(r"`update_memory` is not for this: it corrects a memory in place", section)


def test_the_readme_says_two_writes_at_once_do_not_see_each_other():
    # Detection reads what is stored when the write looks; writes are not
    # serialized, so two at the same instant are both stored unlinked.
    found = section_bullet(changes_section(), "**Found.**")
    assert "two writes at the same instant" in found
    assert "do not see each other" in found
    assert "pass `replaces`" in found


def section_bullet(section: str, title: str) -> str:
    return section.split(title, 1)[1].split(" - **", 1)[0]

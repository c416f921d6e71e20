"""Documents into chunks: by structure, then size, and never a heading on its own."""

from __future__ import annotations

from accounts.tiers import Tier
from memories import services
from memories.chunking import CHUNK_CHARS, chunk

RUNBOOK = "# Runbook\n\n## Deploy\n\nRun make deploy.\n\n## Rollback\n\nRun make rollback."


def test_a_heading_with_only_subheadings_under_it_opens_the_next_chunk():
    chunks = chunk(RUNBOOK)

    assert [(c.heading, c.text, c.position) for c in chunks] == [
        ("Deploy", "# Runbook\n\n## Deploy\n\nRun make deploy.", 0),
        ("Rollback", "## Rollback\n\nRun make rollback.", 1),
    ]


def test_a_heading_whose_first_paragraph_does_not_fit_beside_it_is_not_left_alone():
    paragraph = "word " * ((CHUNK_CHARS - 10) // 5)
    chunks = chunk(f"## Deploy\n\n{paragraph.strip()}\n\n## Next\n\nMore.")

    assert chunks[0].text.startswith("## Deploy\n\nword word")
    assert [c.text for c in chunks if c.text.strip() in ("## Deploy", "## Next")] == []
    assert len(chunks) == 2


def test_a_long_paragraph_cut_into_sentences_still_starts_under_its_heading():
    chunks = chunk("# Usage\n\n" + "Run the server with make serve. " * 60)

    assert chunks[0].text.startswith("# Usage\n\nRun the server")  # not "# Usage Run the..."
    assert len(chunks) == 2
    assert all(len(c.text) <= CHUNK_CHARS for c in chunks)


def test_a_heading_at_the_very_end_closes_the_last_chunk():
    chunks = chunk("Some notes.\n\n# Appendix")

    assert [c.text for c in chunks] == ["Some notes.\n\n# Appendix"]


def test_a_document_that_is_only_a_heading_is_still_stored():
    assert [c.text for c in chunk("# Just a title")] == ["# Just a title"]


def test_a_hash_line_in_a_code_block_is_not_a_heading():
    chunks = chunk("```\n# a shell comment\n```\n\n# Real\n\ntext")

    assert [c.text for c in chunks] == ["```\n# a shell comment\n```", "# Real\n\ntext"]


def test_a_stored_document_has_no_memory_that_is_only_a_heading(cast, agents):
    stored = services.add_document(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        agent_id=agents.research.id,
        content=RUNBOOK,
        path="ops/runbook.md",
    )
    found = services.search_sources(
        user_id=cast.alice.id,
        agent_id=agents.research.id,
        query="runbook deploy rollback",
        threshold=0,
        path="ops/runbook.md",
    )

    assert len(stored) == 2
    assert sorted(m["content"] for m in found) == [
        "# Runbook\n\n## Deploy\n\nRun make deploy.",
        "## Rollback\n\nRun make rollback.",
    ]


def test_a_document_added_in_a_session_belongs_to_its_thread(cast, agents):
    # Seed 003: "Reuse the same value to group a session's memories."
    def add(thread_id):
        return services.add(
            user_id=cast.alice.id,
            tier=Tier.PRO,
            agent_id=agents.research.id,
            document={"content": RUNBOOK, "path": "ops/runbook.md"},
            thread_id=thread_id,
        )

    in_session = add("session-7")
    again = add("session-7")
    agent_wide = add(None)

    assert all(not m["deduped"] for m in in_session) and all(m["deduped"] for m in again)
    assert {m["id"] for m in agent_wide}.isdisjoint(m["id"] for m in in_session)
    found = services.search_sources(
        user_id=cast.alice.id,
        agent_id=agents.research.id,
        query="runbook rollback",
        threshold=0,
        path="ops/runbook.md",
    )
    threads = {m["id"]: m["thread_id"] for m in found}
    assert {threads[m["id"]] for m in in_session if m["id"] in threads} == {"session-7"}
    assert {threads[m["id"]] for m in agent_wide if m["id"] in threads} == {None}


def test_a_document_of_headings_alone_is_cut_to_the_size_too():
    # Carried without bound, 40,000 headings were one memory of 199,998 characters,
    # and a run of headings joined by blank lines came out longer than the input.
    for document in (
        "# h\n\n" * 40000,
        "".join("#" * (1 + i % 6) + f" H{i}\n" for i in range(20000))[:200000],
    ):
        chunks = chunk(document)

        assert max(len(c.text) for c in chunks) <= 2 * CHUNK_CHARS
        assert [c.position for c in chunks] == list(range(len(chunks)))
        assert sum(len(c.text) for c in chunks) <= len(document) * 1.1


def test_headings_after_the_last_text_still_close_its_chunk():
    document = "# Runbook\n\nRestart the worker.\n\n## Later\n\n### Even later\n"

    [only] = chunk(document)

    assert only.text == "# Runbook\n\nRestart the worker.\n\n## Later\n\n### Even later"


def test_headings_carried_into_the_last_chunk_keep_it_within_twice_the_size():
    # Headings after the last text were added to a chunk that could already open
    # with carried headings: three times the size.
    document = "\n\n".join(["# " + "a" * 95, "w " * 49 + "w", "## " + "b" * 94])

    chunks = chunk(document, size=100)

    assert max(len(c.text) for c in chunks) <= 200
    assert "".join(c.text for c in chunks).count("a" * 95) == 1
    assert "".join(c.text for c in chunks).count("b" * 94) == 1

"""The knowledge-update set holds what the benchmark and the issue's targets need."""

from __future__ import annotations

import itertools

from bench import knowledge_set as ks


def test_it_has_at_least_150_chains_with_questions() -> None:
    splits = [ks.load(name) for name in ks.SPLITS]

    assert sum(len(s.chains) for s in splits) >= 150
    for split in splits:
        for chain in split.chains:
            assert len(chain["memories"]) >= 2, chain["id"]
            assert chain["questions"], chain["id"]
            assert chain["style"] in {"change", "negation", "correction", "implicit"}
        for group in split.lookalikes:
            assert len(group["facts"]) == len(group["questions"]) == 2, group["id"]
        assert len(split.distractors) >= 30


def test_every_style_of_update_is_there() -> None:
    for name in ks.SPLITS:
        styles = {chain["style"] for chain in ks.load(name).chains}
        assert styles == {"change", "negation", "correction", "implicit"}, name


def test_the_parts_share_no_text() -> None:
    parts = [ks.load(name) for name in ks.SPLITS]

    for a, b in itertools.combinations(parts, 2):
        assert not {i.content for i in a.items} & {i.content for i in b.items}, (a.name, b.name)
        assert not {q.text for q in a.questions} & {q.text for q in b.questions}
        assert not {c["id"] for c in a.chains} & {c["id"] for c in b.chains}


def test_the_stream_stores_each_replacement_after_what_it_replaces() -> None:
    for name in ks.SPLITS:
        split = ks.load(name)
        place = {item.key: n for n, item in enumerate(split.items)}
        assert len(place) == len(split.items)  # every memory once
        for item in split.items:
            if item.role != "distractor" and item.index:
                assert place[f"{item.role}:{item.group}:{item.index - 1}"] < place[item.key]


def test_a_chain_question_targets_the_last_version_and_lists_the_older() -> None:
    split = ks.load("dev")
    [question] = [q for q in split.questions if q.group == "main-region"]

    assert question.target == "chain:main-region:2"
    assert question.outdated == ("chain:main-region:0", "chain:main-region:1")
    assert split.by_key[question.target].content.startswith("The main app's primary region")

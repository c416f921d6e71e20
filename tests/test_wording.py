"""core/wording.py: pydantic's validation errors, said from the published schema, in our words.

The end-to-end cases, over real MCP clients, are in test_error_wording.py;
these pin the phrases for each kind of schema the tool catalogues publish,
against the real argument models.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field, ValidationError

from core import wording
from memories.mcp.arguments import MetadataFilter, Namespace, PriorityFilter, Threshold
from tests import fuzz


class Turn(BaseModel):
    role: str = Field(min_length=1, max_length=32)
    content: str = Field(min_length=1, max_length=500)
    name: str | None = Field(None, max_length=200)


class Arguments(BaseModel):
    query: Annotated[str, Field(min_length=1, max_length=10_000)]
    namespace: Namespace = "default"
    limit: Annotated[int, Field(ge=1, le=50)] = 10
    threshold: Threshold = None
    mode: Literal["hybrid", "semantic", "lexical"] | None = None
    metadata_filter: MetadataFilter = None
    priority: PriorityFilter = None
    turns: Annotated[list[Turn] | None, Field(min_length=1, max_length=100)] = None
    labels: Annotated[list[str], Field(max_length=3)] = []
    purge: bool = False


def said(arguments: dict[str, Any]) -> str:
    try:
        Arguments.model_validate(arguments)
    except ValidationError as exc:
        message = wording.problem(exc.errors(include_input=False), Arguments.model_json_schema())
    else:
        raise AssertionError("the arguments were valid")
    fuzz.check_wording(message, arguments)
    return message


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, "query is required."),
        ({"query": ""}, "query must be text of 1 to 10,000 characters."),
        ({"query": 5}, "query must be text of 1 to 10,000 characters."),
        ({"query": "q", "limit": 0}, "limit must be a whole number between 1 and 50."),
        ({"query": "q", "limit": 2.5}, "limit must be a whole number between 1 and 50."),
        ({"query": "q", "limit": "9" * 5000}, "limit must be a whole number between 1 and 50."),
        ({"query": "q", "threshold": "high"}, "threshold must be a number between 0 and 1."),
        ({"query": "q", "mode": "fuzzy"}, "mode must be one of: hybrid, semantic, lexical."),
        ({"query": "q", "purge": "perhaps"}, "purge must be true or false."),
        (
            {"query": "q", "namespace": "has spaces"},
            "namespace must be text of 1 to 64 characters (letters, digits and _ . : / @ -).",
        ),
        (
            {"query": "q", "priority": ["urgent"]},
            "priority must be one of: critical, high, medium, low, or a list of them.",
        ),
        (
            {"query": "q", "metadata_filter": "team"},
            "metadata_filter must be an object of at most 8 keys.",
        ),
        (
            {"query": "q", "metadata_filter": {"team": {"name": "platform"}}},
            "metadata_filter['team'] must be text, a number, true or false, or null.",
        ),
        (
            {"query": "q", "metadata_filter": {"it's": [1]}},
            'metadata_filter["it\'s"] must be text, a number, true or false, or null.',
        ),
        ({"query": "q", "turns": "hello"}, "turns must be a list of 1 to 100 items."),
        ({"query": "q", "turns": ["hello"]}, "turns[0] must be an object with role and content."),
        (
            {"query": "q", "turns": [{"role": "user", "content": "hi"}, {"role": "user"}]},
            "turns[1].content is required.",
        ),
        (
            {"query": "q", "turns": [{"role": "user", "content": "hi", "name": 7}]},
            "turns[0].name must be text of at most 200 characters.",
        ),
        (
            {"query": "q", "labels": ["a", "b", "c", "d"]},
            "labels must be a list of at most 3 items.",
        ),
    ],
)
def test_each_kind_of_argument_is_described_in_our_words(arguments, expected):
    assert said(arguments) == expected


def test_one_place_is_described_once_however_many_union_branches_failed():
    # pydantic reports the value once per branch (str, int, float, bool).
    message = said({"query": "q", "metadata_filter": {"team": [1]}})

    assert message.count("metadata_filter['team']") == 1


def test_past_three_places_the_rest_are_counted():
    arguments = {"query": "", "limit": 0, "threshold": 2, "mode": "x", "purge": "x"}

    assert said(arguments) == (
        "query must be text of 1 to 10,000 characters. "
        "limit must be a whole number between 1 and 50. "
        "threshold must be a number between 0 and 1. (2 more problems not shown.)"
    )


def test_the_value_sent_is_never_quoted_back():
    secret = "Alice's salary is 212,000 and her PIN is 4417"

    for arguments in (
        {"query": secret * 400},
        {"query": "q", "namespace": secret},
        {"query": "q", "mode": secret},
        {"query": "q", "turns": [{"role": secret * 2, "content": "x"}]},
        {"query": "q", "metadata_filter": {"k": [secret]}},
    ):
        assert "salary" not in said(arguments)


def test_a_tool_that_takes_no_arguments_says_so():
    assert wording.accepted("memory_stats", []) == "memory_stats takes no arguments."
    assert wording.accepted("job_status", ["job_id"]) == "job_status takes: job_id."


def test_the_fuzzer_reads_a_name_the_caller_chose_as_the_callers_word():
    # A refusal that quotes back an argument the caller named like one of
    # the validation library's own fields is in our words: found by a CI run
    # of the fuzzer on memory_filters({"input_type": None}).
    message = "Unknown argument 'input_type'. memory_filters takes no arguments."
    error = {"error": {"code": "validation_failed", "message": message}}
    body = {
        "result": {
            "isError": True,
            "structuredContent": error,
            "content": [{"type": "text", "text": json.dumps(error)}],
        }
    }

    assert fuzz.check_tool_result(body, {"input_type": None}, {"properties": {}}) is None
    # The same words from the server, not quoted back from the caller, are a leak.
    with pytest.raises(AssertionError):
        fuzz.check_tool_result(body, {"other": None}, {"properties": {}})

"""The README's tool table and `<memory>` example name what the tools actually return."""

from __future__ import annotations

import re

from memories.formatting import memory_tag
from memories.mcp.tools import JobOutput
from recall.tests.test_readme import README, tool_rows


def test_the_job_status_row_names_every_field_job_status_returns():
    row = tool_rows()["job_status"]

    for field in JobOutput.model_fields:
        assert re.search(rf"\b{field}\b", row), field


def test_the_memory_tag_example_has_every_attribute_of_a_plain_result():
    tag = memory_tag(
        {
            "id": "m1",
            "similarity": 0.9,
            "score": 0.8,
            "namespace": "default",
            "created_at": "2025-01-01T00:00:00Z",
            "content": "x",
        }
    )
    rendered = re.findall(r'(\w+)="', tag)
    example = re.search(r"`<memory ([^`]*)>`", README)

    assert example is not None
    assert re.findall(r'(\w+)="', example[1]) == rendered

"""A bad value inside metadata or a metadata filter is refused naming the argument it is in."""

from __future__ import annotations

import pytest

from core.errors import ValidationFailed
from memories import services


@pytest.mark.parametrize(
    ("filter_", "said"),
    [
        ({"team": "a\x00b"}, "metadata_filter must not contain NUL"),
        ({"te\x00am": 1}, "metadata_filter must not contain NUL"),
        ({"team": float("nan")}, "metadata_filter numbers must be finite"),
        ({"team": float("inf")}, "metadata_filter numbers must be finite"),
    ],
)
def test_a_bad_filter_value_is_named_as_the_filter_not_as_metadata(cast, filter_, said):
    with pytest.raises(ValidationFailed) as refused:
        services.recall(user_id=cast.alice.id, query="team", metadata_filter=filter_)

    assert refused.value.message.startswith(said)


def test_bad_metadata_on_a_write_is_still_named_metadata(cast):
    with pytest.raises(ValidationFailed) as refused:
        services.remember(
            user_id=cast.alice.id, tier="pro", content="a note", metadata={"k": float("nan")}
        )

    assert refused.value.message.startswith("metadata numbers must be finite")

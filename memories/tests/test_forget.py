from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.tiers import Tier
from core import tenancy
from core.errors import ConfirmationExpired, ConfirmationInvalid, NotFound, ValidationFailed
from memories import services
from memories.models import ForgetConfirmation, Memory

COFFEE = [
    "The user drinks a double espresso every morning.",
    "The user likes oat milk in coffee.",
]
OTHER = ["The user's dog is a border collie named Pip.", "The user lives in Lisbon."]


def remember(user_id, content, namespace="default"):
    return services.remember(user_id=user_id, tier=Tier.PRO, content=content, namespace=namespace)[
        "id"
    ]


def ids_of(user_id) -> set[str]:
    with tenancy.tenant(user_id):
        return {str(i) for i in Memory.objects.values_list("id", flat=True)}


# by_id


def test_it_forgets_one_memory_by_id(cast):
    keep = remember(cast.alice.id, "keep me")
    gone = remember(cast.alice.id, "forget me")

    assert services.forget_by_id(user_id=cast.alice.id, id=gone) == {"success": True}

    assert ids_of(cast.alice.id) == {keep}


def test_forgetting_an_unknown_id_is_not_found(cast):
    with pytest.raises(NotFound):
        services.forget_by_id(user_id=cast.alice.id, id=str(uuid.uuid4()))


def test_charlie_cannot_forget_alices_memory_by_id(cast):
    memory_id = remember(cast.alice.id, "Alice's memory")

    with pytest.raises(NotFound):
        services.forget_by_id(user_id=cast.charlie.id, id=memory_id)

    assert ids_of(cast.alice.id) == {memory_id}


def test_a_malformed_id_is_a_validation_error(cast):
    with pytest.raises(ValidationFailed):
        services.forget_by_id(user_id=cast.alice.id, id="1; DROP TABLE memories")


def test_a_namespace_given_with_an_id_must_be_the_memorys(cast):
    # The namespace was ignored: a memory in "work" was deleted by a call
    # that named "home".
    memory_id = remember(cast.alice.id, "The standup is at 9:30.", namespace="work")

    with pytest.raises(NotFound) as caught:
        services.forget(user_id=cast.alice.id, mode="by_id", id=memory_id, namespace="home")
    assert caught.value.message == f"No memory with id {memory_id} in namespace home."
    assert ids_of(cast.alice.id) == {memory_id}

    done = services.forget(user_id=cast.alice.id, mode="by_id", id=memory_id, namespace="work")
    assert done == {"success": True}
    assert ids_of(cast.alice.id) == set()


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"query": "standup"}, "query belongs"),
        ({"metadata_filter": {"team": "a"}}, "metadata_filter belongs"),
        ({"confirmation_token": "x" * 20}, "confirmation_token belongs"),
        ({"query": "standup", "threshold": 0.5}, "query and threshold belong "),
        ({"limit": 5}, "limit belongs"),
        ({"include_superseded": True}, "include_superseded belongs"),
    ],
)
def test_by_id_refuses_the_arguments_of_the_other_modes_and_deletes_nothing(cast, given, named):
    memory_id = remember(cast.alice.id, "The standup is at 9:30.")

    with pytest.raises(ValidationFailed) as caught:
        services.forget(user_id=cast.alice.id, mode="by_id", id=memory_id, **given)

    assert named in caught.value.message
    assert ids_of(cast.alice.id) == {memory_id}


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"query": "standup"}, "query belongs"),
        ({"metadata_filter": {"team": "a"}}, "metadata_filter belongs"),
        ({"created_after": "2026-01-01T00:00:00Z"}, "created_after belongs"),
        ({"threshold": 0.5, "id": "x"}, "threshold and id belong "),
        ({"limit": 5}, "limit belongs"),
    ],
)
def test_all_refuses_the_arguments_of_the_other_modes_and_deletes_nothing(cast, given, named):
    # They were dropped: "all" with a query previewed, and then deleted, the whole namespace.
    memory_id = remember(cast.alice.id, "The standup is at 9:30.")
    preview = services.forget(user_id=cast.alice.id, mode="all", namespace="default")

    for call in ({}, {"confirmation_token": preview["confirmation_token"]}):
        with pytest.raises(ValidationFailed) as caught:
            services.forget(user_id=cast.alice.id, mode="all", namespace="default", **call, **given)
        assert named in caught.value.message
    assert ids_of(cast.alice.id) == {memory_id}


def test_all_confirmed_naming_another_namespace_is_refused_and_the_token_kept(cast):
    # The namespace at the confirmation was dropped: the preview's was emptied.
    memory_id = remember(cast.alice.id, "The standup is at 9:30.")
    preview = services.forget(user_id=cast.alice.id, mode="all", namespace="default")
    token = preview["confirmation_token"]

    with pytest.raises(ValidationFailed) as caught:
        services.forget(
            user_id=cast.alice.id, mode="all", namespace="work", confirmation_token=token
        )

    assert caught.value.message == ("This confirmation token empties namespace default, not work.")
    assert ids_of(cast.alice.id) == {memory_id}
    done = services.forget(
        user_id=cast.alice.id, mode="all", namespace="default", confirmation_token=token
    )
    assert done["deleted_count"] == 1


# by_query


def test_preview_lists_matches_and_deletes_nothing(cast):
    coffee = {remember(cast.alice.id, c) for c in COFFEE}
    for c in OTHER:
        remember(cast.alice.id, c)

    # The espresso shares no word with the query: it scores 0.27 (by similarity alone 0.53).
    preview = services.forget_preview(user_id=cast.alice.id, query="coffee habits", threshold=0.15)

    assert preview["preview"] is True
    assert {m["id"] for m in preview["matches"]} == coffee
    assert preview["total_matches"] == 2
    assert set(preview["matches"][0]) == {"id", "content", "similarity", "score"}
    assert len(preview["confirmation_token"]) >= 40
    assert preview["expires_at"].endswith("Z")
    assert len(ids_of(cast.alice.id)) == 4


def test_confirm_deletes_exactly_the_previewed_ids_without_re_running_the_query(cast):
    for c in COFFEE:
        remember(cast.alice.id, c)
    others = {remember(cast.alice.id, c) for c in OTHER}
    preview = services.forget_preview(user_id=cast.alice.id, query="coffee", threshold=0.15)
    # Added after the preview and matching the query: must survive.
    late = remember(cast.alice.id, "The user drinks filter coffee at weekends.")

    result = services.forget_confirm(
        user_id=cast.alice.id, confirmation_token=preview["confirmation_token"]
    )

    assert result == {"success": True, "deleted_count": 2}
    assert ids_of(cast.alice.id) == others | {late}


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"query": "coffee"}, "query belongs to the preview"),
        ({"threshold": 0.99, "limit": 1}, "threshold and limit belong to the preview"),
        ({"metadata_filter": {"team": "a"}}, "metadata_filter belongs"),
        ({"id": "x"}, 'mode "by_query" takes a query to preview, or a confirmation_token'),
        ({"namespace": "work"}, "deletes memories of namespace default, not work"),
    ],
)
def test_a_by_query_confirmation_refuses_what_could_narrow_nothing_and_keeps_its_token(
    cast, given, named
):
    # They were dropped: limit 1 beside the token deleted every previewed memory.
    coffee = {remember(cast.alice.id, c) for c in COFFEE}
    preview = services.forget(
        user_id=cast.alice.id, mode="by_query", query="coffee", threshold=0.15
    )
    token = preview["confirmation_token"]

    with pytest.raises(ValidationFailed) as caught:
        services.forget(user_id=cast.alice.id, mode="by_query", confirmation_token=token, **given)

    assert named in caught.value.message
    assert ids_of(cast.alice.id) == coffee
    done = services.forget(
        user_id=cast.alice.id, mode="by_query", confirmation_token=token, namespace="default"
    )
    assert done["deleted_count"] == 2


def test_a_by_query_preview_refuses_an_id(cast):
    memory_id = remember(cast.alice.id, COFFEE[0])

    with pytest.raises(ValidationFailed, match="id belongs to the other modes"):
        services.forget(user_id=cast.alice.id, mode="by_query", query="coffee", id=memory_id)

    assert ids_of(cast.alice.id) == {memory_id}


def test_the_token_works_once(cast):
    remember(cast.alice.id, COFFEE[0])
    token = services.forget_preview(user_id=cast.alice.id, query="espresso", threshold=0.3)[
        "confirmation_token"
    ]
    services.forget_confirm(user_id=cast.alice.id, confirmation_token=token)

    with pytest.raises(ConfirmationInvalid):
        services.forget_confirm(user_id=cast.alice.id, confirmation_token=token)


def test_the_token_expires_after_five_minutes(cast):
    memory_id = remember(cast.alice.id, COFFEE[0])
    preview = services.forget_preview(user_id=cast.alice.id, query="espresso", threshold=0.3)
    expires = timezone.now() + timedelta(minutes=5)
    assert abs(_parse(preview["expires_at"]) - expires) < timedelta(seconds=5)
    with tenancy.operator():  # the tenant role may not alter confirmations
        ForgetConfirmation.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    with pytest.raises(ConfirmationExpired) as caught:
        services.forget_confirm(
            user_id=cast.alice.id, confirmation_token=preview["confirmation_token"]
        )

    assert caught.value.code == "confirmation_expired"
    assert ids_of(cast.alice.id) == {memory_id}
    # An expired token is spent too.
    with pytest.raises(ConfirmationInvalid):
        services.forget_confirm(
            user_id=cast.alice.id, confirmation_token=preview["confirmation_token"]
        )


def test_an_expired_token_says_so_after_cleanups_until_it_is_a_day_old(cast):
    remember(cast.alice.id, COFFEE[0])
    token = services.forget_preview(user_id=cast.alice.id, query="espresso", threshold=0.3)[
        "confirmation_token"
    ]
    with tenancy.operator():
        ForgetConfirmation.objects.update(expires_at=timezone.now() - timedelta(minutes=10))
    # What clears old confirmations: the user's next preview, and maintenance.
    services.forget_preview(user_id=cast.alice.id, query="espresso", threshold=0.3)
    services.clean_up()

    with pytest.raises(ConfirmationExpired):
        services.forget_confirm(user_id=cast.alice.id, confirmation_token=token)

    stale = services.forget_preview(user_id=cast.alice.id, query="espresso", threshold=0.3)
    with tenancy.operator():
        ForgetConfirmation.objects.update(expires_at=timezone.now() - timedelta(minutes=10))
    services.clean_up(now=timezone.now() + timedelta(days=1))
    with tenancy.operator():
        assert not ForgetConfirmation.objects.exists()
    with pytest.raises(ConfirmationInvalid):
        services.forget_confirm(
            user_id=cast.alice.id, confirmation_token=stale["confirmation_token"]
        )


def test_charlie_cannot_use_alices_token(cast):
    memory_id = remember(cast.alice.id, COFFEE[0])
    token = services.forget_preview(user_id=cast.alice.id, query="espresso", threshold=0.3)[
        "confirmation_token"
    ]

    with pytest.raises(ConfirmationInvalid) as caught:
        services.forget_confirm(user_id=cast.charlie.id, confirmation_token=token)

    assert "not valid" in caught.value.message
    assert ids_of(cast.alice.id) == {memory_id}
    # And Alice's token still works for Alice.
    assert (
        services.forget_confirm(user_id=cast.alice.id, confirmation_token=token)["deleted_count"]
        == 1
    )


def test_charlies_preview_never_matches_alices_memories(cast):
    remember(cast.alice.id, COFFEE[0])

    preview = services.forget_preview(user_id=cast.charlie.id, query=COFFEE[0], threshold=0)

    assert preview["matches"] == []
    assert preview["confirmation_token"] is None


def test_only_a_hash_of_the_token_is_stored(cast):
    remember(cast.alice.id, COFFEE[0])
    token = services.forget_preview(user_id=cast.alice.id, query="espresso", threshold=0.3)[
        "confirmation_token"
    ]
    with tenancy.tenant(cast.alice.id):
        stored = ForgetConfirmation.objects.get()
    assert token not in stored.token_hash
    assert len(stored.token_hash) == 64


def test_an_unknown_token_is_invalid(cast):
    with pytest.raises(ConfirmationInvalid):
        services.forget_confirm(user_id=cast.alice.id, confirmation_token="made-up-token")


@pytest.mark.parametrize("token", ["", None, 5, "x" * 257])
def test_a_malformed_token_is_a_validation_error(cast, token):
    with pytest.raises(ValidationFailed):
        services.forget_confirm(user_id=cast.alice.id, confirmation_token=token)


@pytest.mark.parametrize(
    "kwargs",
    [{"query": ""}, {"limit": 0}, {"limit": 51}, {"threshold": 2}, {"namespace": "a b"}],
)
def test_preview_refuses_bad_input(cast, kwargs):
    with pytest.raises(ValidationFailed):
        services.forget_preview(user_id=cast.alice.id, **{"query": "coffee", **kwargs})


def _parse(stamp: str):
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

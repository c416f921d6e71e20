from __future__ import annotations

import pytest

from accounts import auth
from accounts.models import ApiKey, User
from conftest import issue_key
from core import tenancy
from tests.support import store_memory

URL = "/admin/accounts/user/"


def store(user: User, n: int) -> None:
    for i in range(n):
        store_memory(user, f"m{i}")


def row_of(response, email: str) -> str:
    text = response.content.decode()
    start = text.index(email)
    return text[start : text.index("</tr>", start)]


def test_the_list_shows_tier_memory_count_key_count_and_created(cast, admin_client):
    store(cast.alice, 3)
    with tenancy.operator():
        ApiKey.objects.filter(id=cast.bob_key.key.id).update(revoked_at="2026-01-01T00:00Z")

    response = admin_client.get(URL)

    assert response.status_code == 200
    alice = row_of(response, "alice@example.com")
    assert 'class="field-tier">Free<' in alice
    assert 'class="field-memory_count">3<' in alice
    assert 'class="field-key_count">1<' in alice  # live keys only
    assert "field-created_at" in alice
    charlie = row_of(response, "charlie@example.com")
    assert 'class="field-memory_count">0<' in charlie


def test_counts_cost_the_same_number_of_queries_for_many_users(
    cast, admin_client, django_assert_max_num_queries
):
    admin_client.get(URL)  # warm the session and content types
    with django_assert_max_num_queries(12) as few:
        admin_client.get(URL)
    for n in range(30):
        user = User.objects.create_user(f"user{n}@example.com")
        issue_key(user, "k")
        store(user, 2)
    with django_assert_max_num_queries(len(few.captured_queries)):
        admin_client.get(URL)


def test_it_searches_by_email(cast, admin_client):
    response = admin_client.get(URL, {"q": "charlie"})

    text = response.content.decode()
    assert "charlie@example.com" in text
    assert "alice@example.com" not in text


def test_it_filters_by_tier(cast, admin_client):
    User.objects.filter(id=cast.charlie.id).update(tier="pro")

    response = admin_client.get(URL, {"tier__exact": "pro"})

    text = response.content.decode()
    assert "charlie@example.com" in text
    assert "alice@example.com" not in text


def test_changing_the_tier_moves_every_key_and_the_auth_cache(cast, admin_client):
    assert auth.authenticate(cast.bob_key.raw).tier == "free"
    form = admin_client.get(f"{URL}{cast.alice.id}/change/").context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k != "password"}
    data.update(tier="team", groups=[], user_permissions=[])
    data["created_at_0"], data["created_at_1"] = "2026-01-01", "00:00:00"

    response = admin_client.post(f"{URL}{cast.alice.id}/change/", data)

    assert response.status_code == 302, response.context["adminform"].form.errors
    assert User.objects.get(id=cast.alice.id).tier == "team"
    with tenancy.operator():
        assert set(ApiKey.objects.filter(user=cast.alice).values_list("tier", flat=True)) == {
            "team"
        }
    assert auth.authenticate(cast.bob_key.raw).tier == "team"


def test_deactivating_a_user_stops_their_cached_keys_at_once(cast, admin_client):
    assert auth.authenticate(cast.alice_key.raw) is not None  # cached now
    form = admin_client.get(f"{URL}{cast.alice.id}/change/").context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k != "password"}
    data.pop("is_active")  # an unticked box is absent from the form
    data.update(groups=[], user_permissions=[])
    data["created_at_0"], data["created_at_1"] = "2026-01-01", "00:00:00"

    response = admin_client.post(f"{URL}{cast.alice.id}/change/", data)

    assert response.status_code == 302, response.context["adminform"].form.errors
    assert not User.objects.get(id=cast.alice.id).is_active
    assert auth.authenticate(cast.alice_key.raw) is None


def test_the_tier_action_sets_users_and_their_keys(cast, admin_client):
    auth.authenticate(cast.charlie_key.raw)

    admin_client.post(
        URL, {"action": "set_users_tier_starter", "_selected_action": [str(cast.charlie.id)]}
    )

    assert User.objects.get(id=cast.charlie.id).tier == "starter"
    assert auth.authenticate(cast.charlie_key.raw).tier == "starter"
    assert User.objects.get(id=cast.alice.id).tier == "free"


def test_an_operator_creates_a_user_with_a_normalised_email(db, admin_client):
    response = admin_client.post(
        f"{URL}add/",
        {
            "email": "New.Person@Example.COM",
            "tier": "pro",
            "usable_password": "true",
            "password1": "a-long-passphrase-1",
            "password2": "a-long-passphrase-1",
        },
    )

    assert response.status_code == 302
    user = User.objects.get(email="new.person@example.com")
    assert user.tier == "pro"
    assert user.check_password("a-long-passphrase-1")


def test_the_same_email_in_other_case_is_refused(cast, admin_client):
    response = admin_client.post(
        f"{URL}add/",
        {"email": "ALICE@example.com", "tier": "free", "usable_password": "false"},
    )

    assert response.status_code == 200
    assert "already exists" in response.content.decode()


@pytest.mark.parametrize("path", ["", "add/"])
def test_non_staff_users_are_sent_to_the_login(cast, client, path):
    client.force_login(cast.alice)

    assert client.get(URL + path).status_code == 302


def test_the_delete_confirmation_counts_rather_than_lists(cast, admin_client):
    store(cast.alice, 4)

    response = admin_client.get(f"{URL}{cast.alice.id}/delete/")

    text = response.content.decode()
    assert response.status_code == 200
    assert "4 memories" in text
    assert "2 API keys" in text
    assert "Memory:" not in text  # no memory is listed, let alone its content
    assert "secret memory" not in text


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("bulk", [False, True], ids=["delete page", "delete_selected action"])
def test_a_deleted_users_keys_stop_at_once(cast, admin_client, bulk):
    # The keys went with the user, but the key cache went on taking them
    # for up to its TTL.
    assert auth.authenticate(cast.alice_key.raw) is not None  # cached now

    if bulk:
        action = {"action": "delete_selected", "_selected_action": [cast.alice.id], "post": "yes"}
        response = admin_client.post(URL, action)
    else:
        response = admin_client.post(f"{URL}{cast.alice.id}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert auth.authenticate(cast.alice_key.raw) is None
    assert auth.authenticate(cast.charlie_key.raw) is not None

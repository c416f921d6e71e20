from __future__ import annotations

import re

import pytest
from django.core import mail

from accounts.models import User


def test_the_root_sends_signed_out_visitors_to_sign_in(client):
    response = client.get("/")

    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/"


def test_the_root_lands_signed_in_users_on_their_usage(cast, alice_client):
    response = alice_client.get("/")

    assert response.status_code == 302
    assert response["Location"] == "/usage/"


def test_users_sign_in_with_email_and_password(cast, client):
    response = client.post(
        "/login/", {"username": "Alice@Example.com", "password": "alice-password-1"}
    )

    assert response.status_code == 302
    assert response["Location"] == "/usage/"
    assert client.get("/usage/").status_code == 200


def test_a_wrong_password_is_refused_without_saying_which_part(cast, client):
    response = client.post("/login/", {"username": "alice@example.com", "password": "nope"})

    assert response.status_code == 200
    assert "do not match an account" in response.content.decode()


def test_signing_out_needs_post(cast, alice_client):
    alice_client.post("/logout/")

    assert alice_client.get("/usage/").status_code == 302


def test_sign_up_is_off_by_default(db, client):
    assert client.get("/signup/").status_code == 404
    assert "Create an account" not in client.get("/login/").content.decode()


def test_sign_up_when_enabled_creates_a_free_account(db, client, settings):
    settings.SIGNUP_ENABLED = True
    assert "Create an account" in client.get("/login/").content.decode()

    response = client.post(
        "/signup/",
        {
            "email": "New@Example.com",
            "password1": "correct-horse-battery",
            "password2": "correct-horse-battery",
        },
    )

    assert response.status_code == 302
    user = User.objects.get(email="new@example.com")
    assert user.tier == "free"
    assert not user.is_staff
    assert client.get("/keys/").status_code == 200


def test_sign_up_refuses_an_existing_email_and_weak_passwords(cast, client, settings):
    settings.SIGNUP_ENABLED = True

    taken = client.post(
        "/signup/",
        {"email": "ALICE@example.com", "password1": "x-y-z-1-2-3-4", "password2": "x-y-z-1-2-3-4"},
    )
    weak = client.post(
        "/signup/", {"email": "dave@example.com", "password1": "123", "password2": "123"}
    )

    assert "already exists" in taken.content.decode()
    assert not User.objects.filter(email="dave@example.com").exists()
    assert weak.status_code == 200


def test_a_password_reset_mails_a_link_that_sets_a_new_password(cast, client):
    response = client.post("/password_reset/", {"email": "alice@example.com"})

    assert response.status_code == 302
    [message] = mail.outbox
    assert message.to == ["alice@example.com"]
    link = re.search(r"http://testserver(/reset/\S+/)", message.body)[1]
    form = client.get(link, follow=True)
    set_password = form.redirect_chain[-1][0]
    done = client.post(
        set_password,
        {"new_password1": "a-brand-new-secret-9", "new_password2": "a-brand-new-secret-9"},
    )
    assert done.status_code == 302
    assert User.objects.get(id=cast.alice.id).check_password("a-brand-new-secret-9")


def test_a_reset_for_an_unknown_address_looks_the_same_and_sends_nothing(db, client):
    response = client.post("/password_reset/", {"email": "nobody@example.com"})

    assert response.status_code == 302
    assert mail.outbox == []


def test_the_sign_in_form_is_csrf_protected(cast):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)

    response = strict.post(
        "/login/", {"username": "alice@example.com", "password": "alice-password-1"}
    )

    assert response.status_code == 403


@pytest.fixture
def paced(settings):
    """Three attempts an hour per address and account (30 per address), on fresh buckets."""
    from accounts import ratelimit

    settings.SIGN_IN_RATE_LIMIT = (3, 3600)
    ratelimit.reset_rate_limiter()
    yield
    ratelimit.reset_rate_limiter()


def sign_in(client, email: str, password: str, address: str = "203.0.113.7", path="/login/"):
    return client.post(path, {"username": email, "password": password}, REMOTE_ADDR=address)


def test_password_guessing_is_paced_and_a_paced_attempt_is_not_checked(cast, client, paced):
    for _ in range(3):
        assert sign_in(client, "alice@example.com", "guess").status_code == 200

    refused = sign_in(client, "alice@example.com", "alice-password-1")  # the right one

    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 1200  # a new attempt every 20 minutes
    text = refused.content.decode()
    assert "Too many sign-in attempts from here. Try again in" in text
    assert 'value="alice@example.com"' in text
    assert client.get("/usage/").status_code == 302  # not signed in


def test_pacing_by_address_and_account_locks_no_one_else_out(cast, client, paced):
    for _ in range(3):
        sign_in(client, "alice@example.com", "guess")

    elsewhere = sign_in(client, "alice@example.com", "alice-password-1", address="198.51.100.4")
    assert elsewhere.status_code == 302  # Alice, from her own address
    client.post("/logout/")
    other = sign_in(client, "charlie@example.com", "charlie-password-1")
    assert other.status_code == 302  # another account from the guessing address


def test_one_address_trying_many_accounts_is_paced_too(cast, client, paced):
    for n in range(30):
        assert sign_in(client, f"user{n}@example.com", "guess").status_code == 200

    assert sign_in(client, "user30@example.com", "guess").status_code == 429
    # An IPv6 client's whole /64 counts as one address.
    assert sign_in(client, "a@example.com", "x", address="2001:db8::1").status_code == 200


def test_the_admins_sign_in_is_paced_too(cast, client, paced):
    def attempt() -> int:
        return sign_in(client, "alice@example.com", "guess", path="/admin/login/").status_code

    assert [attempt() for _ in range(4)] == [200, 200, 200, 429]


def test_a_forged_sign_in_from_another_site_spends_no_attempt(cast, paced):
    # Counted before the CSRF check, a page elsewhere could post the user's
    # email ten times from their own browser and lock them out.
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    for _ in range(5):
        assert sign_in(browser, "alice@example.com", "guess").status_code == 403

    page = browser.get("/login/", REMOTE_ADDR="203.0.113.7")
    token = page.cookies["csrftoken"].value
    signed_in = browser.post(
        "/login/",
        {"username": "alice@example.com", "password": "alice-password-1"},
        REMOTE_ADDR="203.0.113.7",
        HTTP_X_CSRFTOKEN=token,
    )
    assert signed_in.status_code == 302


def reset(client, email: str, address: str = "203.0.113.7"):
    return client.post("/password_reset/", {"email": email}, REMOTE_ADDR=address)


def test_password_resets_are_paced_per_account_whatever_the_address(cast, client, paced):
    # Each request mails the account: unpaced, anyone could fill a user's inbox.
    sent = [reset(client, "alice@example.com", f"203.0.113.{n}").status_code for n in range(4)]

    assert sent == [302, 302, 302, 429]
    assert len(mail.outbox) == 3
    refused = reset(client, "alice@example.com", "198.51.100.9")
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 1200
    assert "Too many reset requests. Try again in" in refused.content.decode()
    # Another spelling of the address that reaches the same account is the same bucket.
    assert reset(client, "ALICE@example.com", "198.51.100.10").status_code == 429
    assert reset(client, "\uff41lice@example.com", "198.51.100.11").status_code == 429
    # Another account, and signing in, are not touched.
    assert reset(client, "charlie@example.com").status_code == 302
    assert sign_in(client, "alice@example.com", "alice-password-1").status_code == 302


def test_a_get_of_the_sign_out_address_asks_and_signs_out_nobody(cast, client):
    # Django answered it with an empty 405, which a browser shows as an error.
    client.force_login(cast.alice)

    asked = client.get("/logout/")

    assert asked.status_code == 200
    assert 'method="post"' in asked.content.decode() and "Sign out?" in asked.content.decode()
    assert client.get("/usage/").status_code == 200  # still signed in
    client.post("/logout/")
    assert client.get("/usage/").status_code == 302
    assert "Signed out" in client.get("/logout/").content.decode()

from __future__ import annotations

import re

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

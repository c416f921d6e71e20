"""Dynamic client registration (RFC 7591): open by default, and bounded.

Anyone may register, so what is stored is checked (redirect URIs a client
could own, a printable name, https informational URIs, the code grant only),
each client address registers a limited number of clients an hour, and a
registration nobody approves within a day stops working and is deleted.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from oauth import tokens
from oauth.models import AccessToken, Application

NATIVE = "http://127.0.0.1:33418/callback"


def register(client, metadata: dict[str, Any], address: str = "192.0.2.10"):
    return client.post(
        "/oauth/register/",
        data=json.dumps(metadata),
        content_type="application/json",
        REMOTE_ADDR=address,
    )


def metadata(**fields: Any) -> dict[str, Any]:
    return {
        "client_name": "Desk Helper",
        "redirect_uris": [NATIVE],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
        **fields,
    }


def test_a_client_registers_without_credentials_by_default(db, client):
    advertised = client.get("/.well-known/oauth-authorization-server").json()
    assert advertised["registration_endpoint"].endswith("/oauth/register/")

    registered = register(client, metadata())

    assert registered.status_code == 201, registered.content
    body = registered.json()
    application = Application.objects.get(client_id=body["client_id"])
    assert application.name == "Desk Helper"
    assert application.registration_source == Application.RegistrationSource.DCR
    assert application.registered_from == "192.0.2.10"
    assert application.approved_at is None


def test_an_operator_turns_registration_off(db, client, settings):
    settings.OAUTH2_PROVIDER = {**django_settings.OAUTH2_PROVIDER, "DCR_ENABLED": False}

    advertised = client.get("/.well-known/oauth-authorization-server").json()
    refused = register(client, metadata())

    assert "registration_endpoint" not in advertised
    assert refused.status_code == 404
    assert not Application.objects.exists()


def test_each_address_registers_a_limited_number_of_clients_an_hour(db, client, settings):
    settings.OAUTH_REGISTRATIONS_PER_HOUR = 3

    made = [register(client, metadata()).status_code for _ in range(3)]
    refused = register(client, metadata())
    elsewhere = register(client, metadata(), address="198.51.100.7")

    assert made == [201, 201, 201]
    assert refused.status_code == 429
    assert 3500 <= int(refused.headers["Retry-After"]) <= 3600
    assert "Too many clients registered from this address" in refused.json()["error_description"]
    assert elsewhere.status_code == 201
    assert Application.objects.count() == 4
    assert Application.objects.filter(registered_from="198.51.100.7").count() == 1

    # An IPv6 client's /64 is one address.
    v6 = [register(client, metadata(), address=f"2001:db8:1:2::{n}").status_code for n in (1, 2, 3)]
    assert v6 == [201, 201, 201]
    assert register(client, metadata(), address="2001:db8:1:2:ffff::9").status_code == 429
    assert register(client, metadata(), address="2001:db8:1:3::1").status_code == 201

    # An hour later the address may register again.
    Application.objects.update(created=timezone.now() - timedelta(minutes=61))
    assert register(client, metadata()).status_code == 201


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({"redirect_uris": ["http://evil.example/cb"]}, "invalid_redirect_uri", "http on another"),
        ({"redirect_uris": ["javascript:alert(1)"]}, "invalid_redirect_uri", "javascript:"),
        ({"redirect_uris": ["data:text/html,hi"]}, "invalid_redirect_uri", "data:"),
        ({"redirect_uris": ["ms-officecmd:launch"]}, "invalid_redirect_uri", "operating system"),
        ({"redirect_uris": ["MS-MSDT:/id"]}, "invalid_redirect_uri", "operating system"),
        ({"redirect_uris": ["search-ms:query=x"]}, "invalid_redirect_uri", "operating system"),
        ({"redirect_uris": ["smb://host/share"]}, "invalid_redirect_uri", "operating system"),
        ({"redirect_uris": ["intent://cb#Intent;end"]}, "invalid_redirect_uri", "fragment"),
        ({"redirect_uris": ["intent://cb"]}, "invalid_redirect_uri", "operating system"),
        ({"redirect_uris": ["https://app.example/cb#x"]}, "invalid_redirect_uri", "fragment"),
        ({"redirect_uris": ["https://me@app.example/cb"]}, "invalid_redirect_uri", "credentials"),
        ({"redirect_uris": ["https://app.example/a b"]}, "invalid_redirect_uri", "spaces"),
        # A lone surrogate reached the database: a 500 for anyone who sent one.
        ({"redirect_uris": [NATIVE + "\ud800"]}, "invalid_redirect_uri", "a URI cannot"),
        ({"redirect_uris": ["https://\udc00.example/cb"]}, "invalid_redirect_uri", "a URI cannot"),
        ({"redirect_uris": [NATIVE + "\x85"]}, "invalid_redirect_uri", "a URI cannot"),
        # A space beyond ASCII: the toolkit splits its stored list on it, and a
        # second URI (plain http, remote) came out that no check had seen.
        *(
            (
                {"redirect_uris": [f"https://ok.example/cb{space}http://evil.example/cb"]},
                "invalid_redirect_uri",
                "a URI cannot",
            )
            for space in ("\u00a0", "\u3000", "\u2028", "\u1680")
        ),
        ({"redirect_uris": ["https://b\u00fccher.example/cb"]}, "invalid_redirect_uri", "punycode"),
        ({"logo_uri": "https://app.example/\ud800"}, "invalid_client_metadata", "logo_uri"),
        # The toolkit refused these in its words: "redirect uri URI validation error".
        ({"redirect_uris": ["myapp:cb"]}, "invalid_redirect_uri", "goes on with /"),
        ({"redirect_uris": ["myapp:"]}, "invalid_redirect_uri", "goes on with /"),
        ({"redirect_uris": ["myapp:///cb"]}, "invalid_redirect_uri", "an empty host"),
        ({"redirect_uris": []}, "invalid_redirect_uri", "1 to 10"),
        ({"redirect_uris": [NATIVE] * 11}, "invalid_redirect_uri", "1 to 10"),
        ({"redirect_uris": NATIVE}, "invalid_redirect_uri", "1 to 10"),
        ({"client_name": "Claude\u202e"}, "invalid_client_metadata", "printable"),
        ({"client_name": "Line\nbreak"}, "invalid_client_metadata", "printable"),
        ({"client_name": "x" * 101}, "invalid_client_metadata", "at most 100"),
        ({"client_name": ["Desk"]}, "invalid_client_metadata", "a string"),
        ({"logo_uri": "javascript:alert(1)"}, "invalid_client_metadata", "logo_uri"),
        ({"client_uri": "http://app.example/"}, "invalid_client_metadata", "client_uri"),
        ({"grant_types": ["client_credentials"]}, "invalid_client_metadata", "grant_types"),
        ({"response_types": ["token"]}, "invalid_client_metadata", "response_types"),
    ],
)
def test_it_refuses_metadata_it_could_not_use_or_show_safely(db, client, fields, code, words):
    refused = register(client, metadata(**fields))

    assert refused.status_code == 400
    assert refused.json()["error"] == code
    assert words in refused.json()["error_description"]
    assert not Application.objects.exists()


@pytest.mark.parametrize(
    ("method", "body", "status"),
    [
        ("post", "[" * 50_000, 400),
        ("put", "[" * 50_000, 400),
        ("post", "{not json", 400),
        ("post", "\udc80", 400),
        ("put", "{not json", 401),  # the toolkit asks for the credential first
    ],
)
def test_a_body_that_is_not_json_is_refused_not_a_crash(db, client, method, body, status):
    # Anonymous: the 50,000 brackets reached the toolkit's json.loads, which recursed
    # until RecursionError, a 500 before any credential or limit was checked.
    path = "/oauth/register/" if method == "post" else "/oauth/register/some-client/"
    sent = body.encode("utf-8", "surrogatepass")

    refused = getattr(client, method)(
        path, data=sent, content_type="application/json", REMOTE_ADDR="192.0.2.10"
    )

    assert refused.status_code == status
    if status == 400:
        assert refused.json()["error"] == "invalid_client_metadata"
    assert not Application.objects.exists()


@pytest.mark.parametrize("method", ["post", "put"])
@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_metadata_not_sent_as_json_is_refused(db, client, method, kind):
    # A text or form body is what a page on another site may send without a
    # preflight; RFC 7591 has clients send JSON.
    path = "/oauth/register/" if method == "post" else "/oauth/register/some-client/"

    refused = getattr(client, method)(
        path, data=json.dumps(metadata()), content_type=kind, REMOTE_ADDR="192.0.2.10"
    )

    assert refused.status_code == 415
    assert refused.json()["error"] == "invalid_client_metadata"
    assert "application/json" in refused.json()["error_description"]
    assert not Application.objects.exists()


def test_json_with_a_charset_registers(db, client):
    registered = client.post(
        "/oauth/register/",
        data=json.dumps(metadata()),
        content_type="application/json; charset=utf-8",
        REMOTE_ADDR="192.0.2.10",
    )

    assert registered.status_code == 201, registered.content


@pytest.mark.parametrize(
    "uri",
    [
        "https://claude.ai/api/mcp/auth_callback",
        "http://localhost:6274/oauth/callback",
        "http://[::1]:8976/callback",
        "cursor://anysphere.cursor-mcp/oauth/callback",
        "com.example.app:/oauth2redirect",
    ],
)
def test_the_redirect_uris_real_clients_use_are_accepted(db, client, uri):
    registered = register(client, metadata(redirect_uris=[uri]))

    assert registered.status_code == 201, registered.content
    application = Application.objects.get(client_id=registered.json()["client_id"])
    assert application.redirect_uri_allowed(uri)


@pytest.mark.parametrize(
    "uri",
    [
        "its://server/help/x.chm",
        "microsoft-edge://evil.example/",
        "wsl:/bin/sh",
        "steam://run/12345",
        "resource://gre/modules/x.js",
        "chrome-extension://abcdefghijklmnop/page.html",
        "jnlp://evil.example/app.jnlp",
        "vscode:/extension/evil.publisher",
        "vscode://file/etc/passwd",
        "vscode://vscode.git/clone?url=https://evil.example/r.git",
        "cursor://file/etc/passwd",
        "Vscode-Insiders:/extension/evil.publisher",
    ],
)
def test_redirect_uris_the_system_or_an_editor_acts_on_are_refused(db, client, uri):
    refused = register(client, metadata(redirect_uris=[uri]))

    assert refused.status_code == 400, refused.content
    assert refused.json()["error"] == "invalid_redirect_uri"
    assert not Application.objects.exists()


@pytest.mark.parametrize(
    "uri",
    [
        "cursor://anysphere.cursor-retrieval/oauth/callback",
        "vscode://publisher.extension/callback",
        "com.example.app:/cb",
    ],
)
def test_an_extensions_callback_and_a_private_use_scheme_still_register(db, client, uri):
    registered = register(client, metadata(redirect_uris=[uri]))

    assert registered.status_code == 201, registered.content


def test_an_update_of_a_registration_is_checked_too(db, client):
    registered = register(client, metadata()).json()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {registered['registration_access_token']}"}
    path = f"/oauth/register/{registered['client_id']}/"

    refused = client.put(
        path,
        data=json.dumps(metadata(redirect_uris=["http://evil.example/cb"])),
        content_type="application/json",
        **auth,
    )
    renamed = client.put(
        path,
        data=json.dumps(metadata(client_name="Desk Helper 2")),
        content_type="application/json",
        **auth,
    )

    assert refused.status_code == 400
    assert renamed.status_code == 200, renamed.content
    assert Application.objects.get(client_id=registered["client_id"]).name == "Desk Helper 2"


def test_a_registration_nobody_approves_within_a_day_expires(db, client):
    stale = register(client, metadata()).json()["client_id"]
    approved = register(client, metadata(client_name="Used")).json()["client_id"]
    day_ago = timezone.now() - timedelta(hours=25)
    Application.objects.update(created=day_ago)
    Application.objects.filter(client_id=approved).update(approved_at=day_ago)

    assert not Application.objects.get(client_id=stale).is_usable(None)
    assert Application.objects.get(client_id=approved).is_usable(None)

    # The next registration, from anywhere, deletes it.
    register(client, metadata(), address="203.0.113.5")
    assert not Application.objects.filter(client_id=stale).exists()
    assert Application.objects.filter(client_id=approved).exists()


def test_a_registration_token_is_no_key_to_the_mcp_endpoints(db, client):
    registered = register(client, metadata()).json()
    raw = registered["registration_access_token"]
    assert AccessToken.objects.filter(application__client_id=registered["client_id"]).exists()

    assert tokens.look_up(raw) is None


@pytest.mark.parametrize("password", ["alice-password-1", "a wrong guess"])
def test_the_password_grant_is_refused_before_any_password_is_checked(db, client, cast, password):
    # oauthlib checked the password before it asked whether the client could
    # use the grant: a wrong guess and a right one were answered differently,
    # and nothing paced the guesses.
    client_id = register(client, metadata()).json()["client_id"]

    refused = client.post(
        "/oauth/token/",
        {
            "grant_type": "password",
            "username": "alice@example.com",
            "password": password,
            "client_id": client_id,
        },
    )

    assert refused.status_code == 400
    assert refused.json()["error"] == "unsupported_grant_type"
    assert refused["Cache-Control"] == "no-store"


def test_a_registration_expired_unapproved_cannot_be_read_or_updated_and_is_deleted(db, client):
    registered = register(client, metadata()).json()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {registered['registration_access_token']}"}
    path = f"/oauth/register/{registered['client_id']}/"
    Application.objects.update(created=timezone.now() - timedelta(hours=25))

    updated = client.put(
        path,
        data=json.dumps(metadata(redirect_uris=["http://127.0.0.1:9/other"])),
        content_type="application/json",
        **auth,
    )
    read = client.get(path, **auth)

    assert updated.status_code == 401
    assert updated.json()["error"] == "invalid_token"
    assert "expired" in updated.json()["error_description"]
    assert read.status_code == 401
    assert not Application.objects.exists()


def test_registration_answers_are_never_cached_and_say_when_the_client_was_issued(db, client):
    before = int(timezone.now().timestamp())
    registered = register(client, metadata())
    body = registered.json()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {body['registration_access_token']}"}
    path = f"/oauth/register/{body['client_id']}/"
    read = client.get(path, **auth)
    updated = client.put(path, data=json.dumps(metadata()), content_type="application/json", **auth)
    confidential = register(client, metadata(token_endpoint_auth_method="client_secret_basic"))

    for answer in (registered, read, updated, confidential):
        assert answer.status_code in (200, 201), answer.content
        assert answer["Cache-Control"] == "no-store"
        assert before - 1 <= answer.json()["client_id_issued_at"] <= before + 60
    assert "client_secret_expires_at" not in body  # a public client has no secret
    assert confidential.json()["client_secret"]
    assert confidential.json()["client_secret_expires_at"] == 0


def test_an_update_naming_another_client_is_refused(db, client):
    registered = register(client, metadata()).json()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {registered['registration_access_token']}"}

    refused = client.put(
        f"/oauth/register/{registered['client_id']}/",
        data=json.dumps(metadata(client_id="someone-else", client_name="Renamed")),
        content_type="application/json",
        **auth,
    )

    assert refused.status_code == 400
    assert refused.json()["error"] == "invalid_client_metadata"
    assert Application.objects.get(client_id=registered["client_id"]).name == "Desk Helper"

"""Dynamic client registration (RFC 7591), open to anyone, and what keeps that safe.

Most MCP clients (those without a Client ID Metadata Document) register
themselves before their first authorization request, so registration is on
by default (``OAUTH_DYNAMIC_REGISTRATION`` turns it off). Because anyone may
call it, a registration is bounded before the toolkit stores it:

* the metadata is checked here, in our words: redirect URIs a client could
  really own (oauth/redirects.py), a printable ``client_name`` of at most
  100 characters, informational URIs that are https, only the
  authorization-code grant;
* each client address (an IPv6 /64 counts as one) may register
  ``OAUTH_REGISTRATIONS_PER_HOUR`` clients an hour (counted in the database,
  under a per-address lock, so every worker and server shares the count);
  more are refused with 429 and ``Retry-After``;
* a registration no user approves within a day is refused from then on
  (``Application.is_usable``) and deleted by the next registration.

The consent page shows a registered client's name as what it is: a claim
the client made about itself (oauth/views.py).
"""

from __future__ import annotations

import json
import math
import unicodedata
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from oauth2_provider import views as toolkit

from core import safejson
from core.addresses import client_address
from oauth import redirects, services

NAME_MAX = 100
WINDOW = timedelta(hours=1)
# Informational URIs a client may send; the consent page never links them,
# but they are checked like the rest so nothing odd is stored.
INFO_URIS = ("client_uri", "logo_uri", "tos_uri", "policy_uri")
GRANT_TYPES = {"authorization_code", "refresh_token"}
# The first key of the two-key advisory locks taken here; the second is the address's hash.
_LOCK_CLASS = 7591
# Unicode categories a name shown to people must not hold: controls, invisible
# formatting (bidirectional overrides can reverse how a name reads), private
# use, lone surrogates, and line or paragraph separators.
_HIDDEN = {"Cc", "Cf", "Co", "Cs", "Zl", "Zp"}


def metadata_problem(data: dict[str, Any]) -> tuple[str, str] | None:
    """Return (RFC 7591 error code, description) for metadata that cannot be registered."""
    uris = data.get("redirect_uris")
    if not isinstance(uris, list) or not uris or len(uris) > redirects.MAX_URIS:
        return (
            "invalid_redirect_uri",
            f"redirect_uris must be a list of 1 to {redirects.MAX_URIS} URIs.",
        )
    for uri in uris:
        problem = redirects.problem(uri)
        if problem:
            return "invalid_redirect_uri", problem[0].upper() + problem[1:] + "."
    name = data.get("client_name")
    if name is not None:
        problem = name_problem(name)
        if problem:
            return "invalid_client_metadata", problem
    for field in INFO_URIS:
        value = data.get(field)
        if value is not None and not _info_uri(value):
            return (
                "invalid_client_metadata",
                f"{field} must be an https URL of at most {redirects.MAX_LENGTH} characters.",
            )
    grants = data.get("grant_types", ["authorization_code"])
    if (
        not isinstance(grants, list)
        or "authorization_code" not in grants
        or not set(grants) <= GRANT_TYPES
    ):
        return (
            "invalid_client_metadata",
            'grant_types may hold only "authorization_code" and "refresh_token", and must hold'
            ' "authorization_code": this server issues tokens only through the consent page.',
        )
    if data.get("response_types", ["code"]) != ["code"]:
        return "invalid_client_metadata", 'response_types must be ["code"].'
    return None


def name_problem(name: object) -> str | None:
    if not isinstance(name, str):
        return "client_name must be a string."
    if len(name) > NAME_MAX:
        return f"client_name must be at most {NAME_MAX} characters."
    if any(unicodedata.category(char) in _HIDDEN for char in name):
        return "client_name must hold only printable characters."
    return None


def _info_uri(value: object) -> bool:
    if not isinstance(value, str) or len(value) > redirects.MAX_LENGTH:
        return False
    if redirects.UNSAFE.search(value):
        return False
    parts = urlsplit(value)
    return parts.scheme == "https" and bool(parts.hostname) and "@" not in parts.netloc


def admit(address: str | None) -> int:
    """Return 0 if ``address`` may register a client now, else the seconds until it may.

    Call inside a transaction that then stores the registration: the lock
    taken here holds until it commits, so concurrent registrations from one
    address are counted one after another. Expired registrations are
    deleted on the way.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [_LOCK_CLASS, address or ""]
        )
    now = timezone.now()
    services.delete_expired_registrations(now=now)
    recent = services.registration_times(address=address, since=now - WINDOW)
    if len(recent) < settings.OAUTH_REGISTRATIONS_PER_HOUR:
        return 0
    oldest = recent[-settings.OAUTH_REGISTRATIONS_PER_HOUR]
    return max(1, math.ceil((oldest + WINDOW - now).total_seconds()))


def _refusal(error: str, description: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": error, "error_description": description}, status=status)


def _checked(request: HttpRequest) -> JsonResponse | None:
    """Refuse metadata we will not store, and JSON nested too deep for the toolkit's own
    parse (it recursed until RecursionError, a 500); leave other malformed JSON to the
    toolkit's answer, which comes after its credential check.

    The body must be sent as JSON (RFC 7591, section 3.1). A form or text body
    is refused: a page on another site can send one without asking first.
    """
    kind = (request.content_type or "").lower()
    if kind != "application/json" and not kind.endswith("+json"):
        return _refusal(
            "invalid_client_metadata",
            "Send the client metadata as JSON, with Content-Type: application/json.",
            status=415,
        )
    try:
        data = safejson.loads(request.body)
    except safejson.TooDeep:
        return _refusal("invalid_client_metadata", "Request body must be valid JSON")
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    problem = metadata_problem(data)
    return _refusal(*problem) if problem else None


def _not_allowed(view: Any, request: HttpRequest) -> HttpResponse:
    """A method the endpoint does not take, refused in JSON as its other errors are."""
    allowed = ", ".join(view._allowed_methods())
    response = _refusal("invalid_request", f"Use {allowed} here.", status=405)
    response["Allow"] = allowed
    return response


def _answered(response: HttpResponse) -> HttpResponse:
    """``response``, uncached, with RFC 7591 section 3.2.1's dates when it describes a client.

    It carries the registration access token, and a secret when one was issued:
    no cache may keep it. ``client_id_issued_at`` is when the client registered;
    a secret never expires (``client_secret_expires_at`` 0), as the field says.
    """
    response["Cache-Control"] = "no-store"
    response["Pragma"] = "no-cache"
    if response.status_code not in (200, 201):
        return response
    data = json.loads(response.content)
    application = services.find_application(client_id=str(data.get("client_id", "")))
    if application is None:
        return response
    data["client_id_issued_at"] = int(application.created.timestamp())
    if application.client_type == application.CLIENT_CONFIDENTIAL:
        data["client_secret_expires_at"] = 0
    response.content = json.dumps(data).encode()
    return response


class RegistrationView(toolkit.DynamicClientRegistrationView):
    """``POST /oauth/register/``: the toolkit's registration, checked and limited first."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        refused = _checked(request)
        if refused is not None:
            return _answered(refused)
        address = client_address(request)
        with transaction.atomic():
            wait = admit(address)
            if wait:
                response: HttpResponse = _refusal(
                    "temporarily_unavailable",
                    f"Too many clients registered from this address in the last hour; "
                    f"try again in {wait} seconds.",
                    status=429,
                )
                response["Retry-After"] = str(wait)
                return _answered(response)
            response = super().post(request, *args, **kwargs)
            if response.status_code == 201:
                client_id = json.loads(response.content)["client_id"]
                services.note_registered_from(client_id=client_id, address=address)
        return _answered(response)

    def http_method_not_allowed(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return _not_allowed(self, request)


class RegistrationManagementView(toolkit.DynamicClientRegistrationManagementView):
    """RFC 7592: a client reads, updates or deletes its own registration; updates are checked.

    A registration that expired unapproved is refused here as everywhere
    (``Application.is_usable``), and deleted: it stops working, and goes.
    """

    def get(self, request: HttpRequest, client_id: str, *args: Any, **kwargs: Any) -> HttpResponse:
        response: HttpResponse = super().get(request, client_id, *args, **kwargs)
        return _answered(response)

    def put(self, request: HttpRequest, client_id: str, *args: Any, **kwargs: Any) -> HttpResponse:
        refused = _checked(request) or _other_client(request, client_id)
        if refused is not None:
            return _answered(refused)
        response: HttpResponse = super().put(request, client_id, *args, **kwargs)
        return _answered(response)

    def delete(
        self, request: HttpRequest, client_id: str, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        response: HttpResponse = super().delete(request, client_id, *args, **kwargs)
        return _answered(response)

    def http_method_not_allowed(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return _not_allowed(self, request)

    def _authenticate_registration_request(self, request: HttpRequest, client_id: str) -> Any:
        authenticated = super()._authenticate_registration_request(request, client_id)
        if isinstance(authenticated, HttpResponse):
            return authenticated
        if not authenticated.application.is_usable(request):
            services.delete_expired_registrations(now=timezone.now())
            # RFC 7592 section 2: a client that no longer exists gets 401 invalid_token.
            return _refusal(
                "invalid_token",
                "This registration expired because no user approved it within a day, "
                "and has been deleted. Register the client again.",
                status=401,
            )
        return authenticated


def _other_client(request: HttpRequest, client_id: str) -> JsonResponse | None:
    """Refuse an update whose body names another client (RFC 7592 section 2.2)."""
    try:
        data = safejson.loads(request.body)
    except ValueError:
        return None  # the toolkit answers malformed JSON
    if isinstance(data, dict) and "client_id" in data and data["client_id"] != client_id:
        return _refusal(
            "invalid_client_metadata",
            "client_id in the body must be this registration's own client_id.",
        )
    return None

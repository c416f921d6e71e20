"""Self-service API keys over JSON, authenticated by an API key.

* ``GET /api/keys`` lists the caller's keys, never their secrets.
* ``POST /api/keys`` with ``{"name"?, "tier"?}`` issues a key and returns its
  secret, the only time it is shown.
* ``DELETE /api/keys/<id>`` revokes one of the caller's keys.

Every request needs ``Authorization: Bearer recall_live_...`` and draws from
the same token bucket as the key's MCP calls. The caller is the key's user:
everything runs on that user's tenant path, so another user's key id is
``not_found``, exactly like an id that does not exist.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from accounts import admission, auth, services
from accounts.auth import AuthContext
from accounts.models import ApiKey
from core import safejson, usage
from core.errors import RecallError, ValidationFailed
from core.timestamps import iso

# One body for a missing, malformed, unknown or revoked key: it must not say
# which, or it would tell a guesser when a key exists.
UNAUTHORIZED = {
    "error": {
        "code": "unauthorized",
        "message": "Missing or invalid API key. Send Authorization: Bearer recall_live_...",
    }
}

View = Callable[..., HttpResponse]


def error(exc: RecallError, headers: dict[str, str] | None = None) -> JsonResponse:
    return JsonResponse(exc.as_dict(), status=exc.http_status, headers=headers)


def bearer(request: HttpRequest) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def key_api(*methods: str) -> Callable[[View], View]:
    """Authenticate, rate-limit and shape errors for a view taking ``(request, caller, ...)``."""

    def decorate(view: View) -> View:
        @csrf_exempt  # bearer auth: a browser never sends this header on its own
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                body = {"error": {"code": "method_not_allowed", "message": "Method not allowed."}}
                return JsonResponse(body, status=405, headers={"Allow": ", ".join(methods)})
            raw = bearer(request)
            caller = auth.authenticate(raw) if raw else None
            if caller is None:
                challenge = 'Bearer realm="recall"' + (', error="invalid_token"' if raw else "")
                return JsonResponse(
                    UNAUTHORIZED, status=401, headers={"WWW-Authenticate": challenge}
                )
            # A revocation is held to the calling key's own bucket only: a
            # leaked key that spent the allowance its user's keys share must
            # not keep them from revoking it.
            admitted = admission.admit(caller, shared=request.method != "DELETE")
            if admitted.error is not None:
                return error(admitted.error, admitted.headers)
            if caller.api_key_id is not None:
                usage.touch_key(caller.api_key_id)
            try:
                response = view(request, caller, *args, **kwargs)
            except RecallError as exc:
                response = error(exc)
            except services.CallerGone:
                # Revoked (or its user deactivated) since the cache read it.
                return JsonResponse(
                    UNAUTHORIZED,
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="recall", error="invalid_token"'},
                )
            for name, value in admitted.headers.items():
                response.headers[name] = value
            # Responses may carry a secret; no cache may keep one.
            response.headers["Cache-Control"] = "no-store"
            return response

        return wrapper

    return decorate


def json_body(request: HttpRequest) -> dict[str, Any]:
    if not request.body.strip():
        return {}
    try:
        body = safejson.loads(request.body)
    except ValueError:
        raise ValidationFailed("The request body must be JSON.") from None
    if not isinstance(body, dict):
        raise ValidationFailed('The request body must be a JSON object, such as {"name": "ci"}.')
    return body


def key_json(key: ApiKey) -> dict[str, Any]:
    return {
        "id": str(key.id),
        "name": key.name,
        "prefix": key.prefix,
        "tier": key.tier,
        "agent_id": str(key.agent_id) if key.agent_id else None,
        "created_at": iso(key.created_at),
        "last_used_at": iso(key.last_used_at) if key.last_used_at else None,
        "revoked_at": iso(key.revoked_at) if key.revoked_at else None,
    }


@key_api("GET", "POST")
def keys(request: HttpRequest, caller: AuthContext) -> HttpResponse:
    if request.method == "GET":
        found = services.list_own_keys(user_id=caller.user_id, agent_id=caller.agent_id)
        return JsonResponse({"keys": [key_json(key) for key in found]})

    body = json_body(request)
    unknown = set(body) - {"name", "tier", "agent_id"}
    if unknown:
        raise ValidationFailed(
            f"Unknown fields: {', '.join(sorted(unknown))}. Send name, tier and agent_id."
        )
    name = body.get("name", "")
    if not isinstance(name, str):
        raise ValidationFailed("name must be a string.")
    agent_id = body.get("agent_id")
    if agent_id is not None and not isinstance(agent_id, str):
        raise ValidationFailed("agent_id must be the id of one of your agents, or null.")
    if caller.agent_id is not None:
        # An agent's key issues keys for that agent only, as it sees only its own.
        if agent_id is not None and agent_id != str(caller.agent_id):
            raise ValidationFailed(
                "This key acts as one agent: it can issue keys for that agent only."
            )
        agent_id = str(caller.agent_id)
    key, raw = services.issue_own_key(
        user_id=caller.user_id,
        agent_id=agent_id,
        max_tier=caller.tier,
        by_key=caller.api_key_id,
        name=name,
        tier=body.get("tier"),
    )
    return JsonResponse({**key_json(key), "key": raw}, status=201)


@key_api("DELETE")
def key(request: HttpRequest, caller: AuthContext, key_id: str) -> HttpResponse:
    services.revoke_own_key(
        user_id=caller.user_id,
        agent_id=caller.agent_id,
        key_id=key_id,
        by_key=caller.api_key_id,
    )
    return JsonResponse({"success": True})

"""Put staff requests to the admin on the operator path; give pages their CSP; pace sign-ins.

``memories``, ``api_keys``, ``usage_events`` and ``forget_confirmations`` have
row-level security FORCED: the role Django connects as sees none of their
rows unless a policy admits them. The admin must see every tenant's rows, so
``OperatorAdminMiddleware`` runs each request that a signed-in, active staff
user makes under the admin's URL prefix inside ``tenancy.operator()``: one
transaction in which the active role is ``recall_operator``. Each of those
tables has an ``operator_access`` policy that admits a row only while
``current_user = 'recall_operator'``, so the privilege exists for exactly
that transaction and ends with it (``SET LOCAL``).

Nothing about the tenant path changes. Dashboard pages, the JSON API and the
MCP endpoint never pass through here; they reach rows through
``tenancy.tenant(user_id)``, whose ``tenant_isolation`` policies still admit
only the caller's own rows. Anonymous and non-staff requests to ``/admin/``
(the login page, a refused user) are not wrapped either.

The operator path is also what lets the admin delete a user: Django deletes
related rows itself, and outside this path it would find none of the user's
memories or keys, delete the user, and fail on the foreign keys.

Streaming responses (the usage CSV export) are produced after this returns;
they enter ``tenancy.operator()`` themselves.

``ContentSecurityPolicyMiddleware`` adds ``core.csp``'s policy to every HTML
response that does not carry one of its own (see that module).

``SignInThrottleMiddleware`` paces password guessing at both sign-in forms
(the dashboard's, which OAuth consent also uses, and the admin's):
``admission.sign_in`` counts each attempt by client address and account,
and past the allowance the page answers 429 with ``Retry-After`` without
checking the password. It paces password-reset requests too
(``admission.password_reset``), each of which sends a mail.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.forms import AuthenticationForm, PasswordResetForm
from django.db import transaction
from django.http import HttpRequest, HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import reverse

from accounts import admission
from core import context, csp, tenancy
from core.addresses import client_address


class OperatorAdminMiddleware:
    # Transactions are synchronous; under ASGI Django runs this in the
    # request's thread, together with the admin's views.
    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self._prefix: str | None = None

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not self._is_operator_request(request):
            return self.get_response(request)
        # Acting as "admin": what the admin changes is the admin's in each memory's
        # history (it read "system", the trigger's fallback).
        with context.acting_as("admin"), tenancy.operator(), transaction.atomic():
            response = self.get_response(request)
            if response.status_code >= 500:
                # Django turned an exception into this response below us;
                # keep none of the request's writes, as ATOMIC_REQUESTS would.
                transaction.set_rollback(True)
        return response

    def _is_operator_request(self, request: HttpRequest) -> bool:
        if self._prefix is None:
            self._prefix = reverse("admin:index")
        if not request.path.startswith(self._prefix):
            return False
        user = getattr(request, "user", None)
        return bool(user is not None and user.is_active and user.is_staff)


class ContentSecurityPolicyMiddleware:
    """Send ``core.csp.POLICY`` and ``PERMISSIONS`` with each HTML response; JSON, MCP and
    files need neither."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        if response.get("Content-Type", "").startswith("text/html"):
            # A page that leads elsewhere set its own (csp.allow_form_action).
            response.setdefault(csp.HEADER, csp.POLICY)
            response.setdefault(csp.PERMISSIONS_HEADER, csp.PERMISSIONS)
        return response


class SignInThrottleMiddleware:
    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self._paths: frozenset[str] | None = None
        self._reset: str | None = None

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any
    ) -> HttpResponseBase | None:
        # Here, not in __call__: CsrfViewMiddleware's process_view runs first
        # and refuses a forged post, which must not spend the user's attempts
        # (a page elsewhere could otherwise lock them out from their own address).
        if request.method != "POST":
            return None
        if request.path == self._reset_path():
            # Each request mails the account: unpaced, anyone could fill a user's inbox.
            account = request.POST.get("email", "")
            wait = admission.password_reset(client_address(request), account)
            form: Any = PasswordResetForm(initial={"email": account[:254]})
            return _paced(request, wait, "registration/password_reset_form.html", {"form": form})
        if request.path not in self._sign_in_paths():
            return None
        account = request.POST.get("username", "")
        wait = admission.sign_in(client_address(request), account)
        form = AuthenticationForm(request, initial={"username": account[:254]})
        page = {"form": form, "next": request.POST.get("next", "")}
        return _paced(request, wait, "registration/login.html", page)

    def _reset_path(self) -> str:
        if self._reset is None:
            self._reset = reverse("password_reset")
        return self._reset

    def _sign_in_paths(self) -> frozenset[str]:
        if self._paths is None:
            self._paths = frozenset({reverse("login"), reverse("admin:login")})
        return self._paths


def _paced(
    request: HttpRequest, wait: int, template: str, page: dict[str, Any]
) -> HttpResponseBase | None:
    """None when ``wait`` is 0; else the form ``template`` again, 429 with Retry-After."""
    if not wait:
        return None
    response = TemplateResponse(
        request, template, {**page, "throttled_minutes": -(-wait // 60)}, status=429
    )
    response["Retry-After"] = str(wait)
    # Rendered here: it goes back up through the middleware, not a view.
    return response.render()

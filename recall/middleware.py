"""Put staff requests to the admin on the operator path; give pages their CSP.

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
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction
from django.http import HttpRequest, HttpResponseBase
from django.urls import reverse

from core import csp, tenancy


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
        with tenancy.operator(), transaction.atomic():
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

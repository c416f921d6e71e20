"""The signed-in user's dashboard: usage, keys, memories and plan.

Every view acts for ``request.user`` only, through the same services as the
MCP tools and the JSON API, on the tenant path: a page can show or change
nothing of another user's, and an id that belongs to someone else is a 404,
like one that does not exist.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LogoutView
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_POST

from accounts import services as accounts_services
from accounts import tiers
from billing import checkout
from billing import services as billing_services
from billing.services import figures
from core import context, csp, once
from core.errors import Conflict, NotFound, RecallError, ValidationFailed
from dashboard.charts import stacked_bars
from dashboard.forms import KeyForm, SignupForm
from dashboard.imports import import_context, refused_import
from dashboard.signed_in import AuthenticatedRequest
from memories import services as memory_services
from memories import transfer
from oauth import resources
from oauth import services as oauth_services

PAGE_SIZE = 20
# A longer memory is shown in the list as its first this many characters, the
# whole of it one click away (its history page shows it in full too).
PREVIEW_CHARS = 600
USAGE_WINDOWS = (7, 30, 90)


def _connect(request: HttpRequest, raw_key: str | None = None) -> dict[str, Any]:
    """Return what the "connect a client" snippets need."""
    mcp_url = request.build_absolute_uri("/mcp")
    parts = urlsplit(mcp_url)
    return {
        "mcp_url": mcp_url,
        "snippet_key": raw_key or "recall_live_YOUR_KEY",
        # mcp-remote takes plain http only for this machine unless told otherwise.
        "remote_allow_http": parts.scheme == "http"
        and parts.hostname not in ("localhost", "127.0.0.1", "::1"),
    }


@login_required
def index(request: AuthenticatedRequest) -> HttpResponse:
    return redirect("dashboard:usage")


FAVICON = Path(__file__).resolve().parent / "static" / "dashboard" / "favicon.ico"


@cache_control(max_age=86400, public=True)
def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, where browsers and feed readers look whatever the page links."""
    return HttpResponse(FAVICON.read_bytes(), content_type="image/x-icon")


# Usage --------------------------------------------------------------------------


@login_required
def usage(request: AuthenticatedRequest) -> HttpResponse:
    try:
        days = int(request.GET.get("days", 30))
    except ValueError:
        days = 30
    if days not in USAGE_WINDOWS:
        days = 30
    user = request.user
    summary = figures.usage_summary(user_id=user.id, days=days)
    by_agent = figures.usage_by_agent(user_id=user.id, days=days)
    quota = memory_services.memory_quota(user_id=user.id, tier=user.tier)
    chart = stacked_bars(summary.days, summary.calls, label=f"Calls per day, last {days} days")
    return render(
        request,
        "dashboard/usage.html",
        {
            "section": "usage",
            "summary": summary,
            # Only worth a table once there is an agent to tell apart.
            "by_agent": by_agent if any(row.agent_id for row in by_agent) else [],
            "quota": quota,
            "chart": chart,
            "days": days,
            "windows": USAGE_WINDOWS,
            **_connect(request),
        },
    )


# Keys ---------------------------------------------------------------------------


@login_required
def keys(request: AuthenticatedRequest) -> HttpResponse:
    user = request.user
    agents = accounts_services.list_agents(user_id=user.id)
    form = KeyForm(request.POST or None, max_tier=user.tier, agents=agents)
    new_key: str | None = None
    if request.method == "POST" and form.is_valid():
        if once.sent_before(request, form.cleaned_data["once"]):
            messages.info(
                request,
                "That form was sent before, and its key is listed below. Its secret was shown"
                " once: if you did not copy it, revoke the key and create another.",
            )
            return redirect("dashboard:keys")
        try:
            _, new_key = accounts_services.issue_own_key(
                user_id=user.id,
                max_tier=user.tier,
                name=form.cleaned_data["name"],
                tier=form.cleaned_data["tier"],
                agent_id=form.cleaned_data["agent"] or None,
            )
        except RecallError as exc:
            once.unspend(request, form.cleaned_data["once"])  # no key came of it
            form.add_error(None, exc.message)
        except Exception:
            once.unspend(request, form.cleaned_data["once"])
            raise
        else:
            # Rendered, not redirected: the secret must not be stored in a
            # session or a cookie on its way to the next page.
            form = KeyForm(max_tier=user.tier, agents=agents)
    if form.is_bound and not new_key:  # shown again to be corrected: a form of its own
        data = request.POST.copy()
        data["once"] = secrets.token_urlsafe(16)
        form.data = data
    else:
        form.initial["once"] = secrets.token_urlsafe(16)
    response = render(
        request,
        "dashboard/keys.html",
        {
            "section": "keys",
            "form": form,
            "keys": accounts_services.list_own_keys(user_id=user.id),
            "new_key": new_key,
            "max_keys": settings.MAX_KEYS_PER_USER,
            **_connect(request, new_key),
        },
    )
    if new_key:
        response.headers["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def revoke_key(request: AuthenticatedRequest, key_id: uuid.UUID) -> HttpResponse:
    try:
        accounts_services.revoke_own_key(user_id=request.user.id, key_id=key_id)
    except NotFound:
        raise Http404("No such key.") from None
    messages.success(request, "Key revoked. Clients using it are refused from now on.")
    return redirect("dashboard:keys")


# Agents ---------------------------------------------------------------------------


@login_required
def agents(request: AuthenticatedRequest) -> HttpResponse:
    user = request.user
    error = None
    if request.method == "POST":
        try:
            agent = accounts_services.create_agent(user_id=user.id, name=request.POST.get("name"))
        except RecallError as exc:
            error = exc.message
        else:
            messages.success(request, f"Agent {agent.name} created.")
            return redirect("dashboard:agents")
    return render(
        request,
        "dashboard/agents.html",
        {
            "section": "agents",
            "agents": accounts_services.list_agents(user_id=user.id),
            "error": error,
            "name": request.POST.get("name", "") if error else "",
            "agent_mcp_url": request.build_absolute_uri(resources.AGENT_MCP_PATH),
        },
    )


@login_required
@require_POST
def delete_agent(request: AuthenticatedRequest, agent_id: uuid.UUID) -> HttpResponse:
    try:
        agent = accounts_services.get_agent(user_id=request.user.id, agent_id=agent_id)
        accounts_services.delete_agent(user_id=request.user.id, agent_id=agent_id)
    except NotFound:
        raise Http404("No such agent.") from None
    messages.success(
        request, f"Agent {agent.name} deleted, with its memories, keys and connections."
    )
    return redirect("dashboard:agents")


# Connected apps ---------------------------------------------------------------------


@login_required
def connections(request: AuthenticatedRequest) -> HttpResponse:
    return render(
        request,
        "dashboard/connections.html",
        {
            "section": "connections",
            "connections": oauth_services.list_connections(user_id=request.user.id),
            "agent_mcp_url": request.build_absolute_uri(resources.AGENT_MCP_PATH),
        },
    )


@login_required
@require_POST
def revoke_connection(request: AuthenticatedRequest, connection_id: uuid.UUID) -> HttpResponse:
    try:
        oauth_services.revoke_connection(user_id=request.user.id, connection_id=connection_id)
    except NotFound:
        raise Http404("No such connection.") from None
    messages.success(request, "Disconnected. The application's tokens stop working at once.")
    return redirect("dashboard:connections")


# Memories -------------------------------------------------------------------------


@login_required
def memories(request: AuthenticatedRequest) -> HttpResponse:
    return _memories_page(request)


def _memories_page(request: AuthenticatedRequest) -> HttpResponse:
    user = request.user
    namespaces = memory_services.list_namespaces(user_id=user.id)
    names = [row["namespace"] for row in namespaces]
    default = "default" if "default" in names or not names else names[0]
    namespace = request.GET.get("namespace") or default
    query = request.GET.get("q", "").strip()
    agents = {str(agent.id): agent for agent in accounts_services.list_agents(user_id=user.id)}
    # Only the user's own agents filter; anything else shows every memory.
    agent = request.GET.get("agent", "")
    agent = agent if agent in agents else ""
    offset = _offset(request)
    # Memories a later one replaced are hidden unless asked for (issue 22).
    replaced = request.GET.get("replaced") == "1"

    error = None
    found: Sequence[Mapping[str, Any]] = []
    more = False
    try:
        if query:
            found = memory_services.recall(
                user_id=user.id,
                agent_id=agent or None,
                query=query,
                namespace=namespace,
                limit=PAGE_SIZE,
                include_superseded=replaced,
            )
        else:
            found = memory_services.list_memories(
                user_id=user.id,
                agent_id=agent or None,
                namespace=namespace,
                limit=PAGE_SIZE + 1,
                offset=offset,
                superseded="include" if replaced else "exclude",
            )
            more = len(found) > PAGE_SIZE
            found = found[:PAGE_SIZE]
    except RecallError as exc:
        error = exc.message
    writers = memory_services.memory_agents(user_id=user.id, ids=[m["id"] for m in found])
    replaces = memory_services.replaced_by_each(user_id=user.id, ids=[m["id"] for m in found])
    results: list[dict[str, object]] = []
    for memory in found:
        writer = agents.get(writers.get(memory["id"]) or "")
        results.append(
            {
                **memory,
                "agent_name": writer.name if writer else "",
                "replaces": replaces.get(memory["id"], []),
            }
        )
    return render(
        request,
        "dashboard/memories.html",
        {
            "section": "memories",
            # A namespace the link names but that holds nothing is still the
            # one shown, so the list offers it rather than showing another.
            "namespaces": namespaces
            if namespace in names or not names
            else [*namespaces, {"namespace": namespace, "count": 0, "replaced": 0}],
            "namespace": namespace,
            "agents": list(agents.values()),
            "agent": agent,
            # What the pager keeps when it moves: the namespace and the agent.
            "filters": urlencode(
                {
                    "namespace": namespace,
                    **({"agent": agent} if agent else {}),
                    **({"replaced": "1"} if replaced else {}),
                }
            ),
            "replaced": replaced,
            # Replaced memories the list hides here: the empty page says so.
            "hidden": 0
            if replaced
            else next((row["replaced"] for row in namespaces if row["namespace"] == namespace), 0),
            "query": query,
            "results": results,
            # A search stops at a page's worth; more may match.
            "limited": bool(query) and len(results) >= PAGE_SIZE,
            "error": error,
            "offset": offset,
            # A search is one page of the best matches: it has no pager (``offset`` is
            # for the list only).
            "newer": max(0, offset - PAGE_SIZE) if offset and not query else None,
            "older": offset + PAGE_SIZE if more else None,
            "retention_days": settings.HISTORY_RETENTION_DAYS,
            "preview_chars": PREVIEW_CHARS,
            **import_context(request),
            **refused_import(request),
            **_connect(request),
        },
    )


def _back_to_memories(request: AuthenticatedRequest) -> HttpResponse:
    """Where a memory's button leads back: the page it was on (``next``), if it is ours."""
    back = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        return HttpResponseRedirect(back)
    return redirect("dashboard:memories")


# A button on a page drawn before its memory was deleted (by an agent, or by
# expiry) meets no memory; nor does one with an id the user never had.
GONE = (
    "That memory is not among yours: it was deleted, it expired, or it never was."
    " Nothing was changed."
)


def _supersession_button(
    request: AuthenticatedRequest,
    act: Callable[[], object],
    done: str,
    gone: str = GONE,
    *,
    undo: uuid.UUID | None = None,
) -> HttpResponse:
    """Run a memory's Restore or Replaced button as the dashboard: a refusal is shown
    with its reason (a memory deleted or expired since the page was drawn too), and the
    page comes back. With ``undo``, the message offers that memory's Restore button."""
    try:
        with context.acting_as("dashboard"):
            act()
    except NotFound:
        messages.error(request, gone)
    except RecallError as exc:
        messages.error(request, exc.message)
    else:
        # The page drawn next puts the button by the message (the restorable filter).
        messages.success(request, done, extra_tags=f"restore:{undo}" if undo else "")
    return _back_to_memories(request)


@login_required
@require_POST
def restore_memory(request: AuthenticatedRequest, memory_id: uuid.UUID) -> HttpResponse:
    """Undo a replacement: the memory is current again (issue 22)."""
    return _supersession_button(
        request,
        lambda: memory_services.restore(user_id=request.user.id, id=str(memory_id)),
        "Memory restored: it is current again.",
    )


@login_required
@require_POST
def link_memory(request: AuthenticatedRequest, memory_id: uuid.UUID) -> HttpResponse:
    """Agree with a mark: the memory is replaced by the newer one that may replace it."""
    return _supersession_button(
        request,
        lambda: memory_services.link(
            user_id=request.user.id, id=str(memory_id), by=request.POST.get("by", "")
        ),
        "Marked as replaced: it is hidden from searches. Restore undoes it.",
        gone="This memory or the one said to replace it no longer exists here: deleted, "
        "expired, or not yours. Nothing was changed.",
        undo=memory_id,
    )


@login_required
@require_POST
def delete_memory(request: AuthenticatedRequest, memory_id: uuid.UUID) -> HttpResponse:
    purge = request.POST.get("purge") == "1"
    # What it replaced is current again once it is gone (the key clears the link).
    freed = memory_services.replaced_by_each(user_id=request.user.id, ids=[str(memory_id)])
    try:
        with context.acting_as("dashboard"):
            memory_services.forget_by_id(user_id=request.user.id, id=str(memory_id), purge=purge)
    except NotFound:
        messages.error(request, GONE)
        return _back_to_memories(request)
    if purge:
        said = "Memory deleted, and its history erased."
    else:
        said = f"Memory deleted. Its history stays for {settings.HISTORY_RETENTION_DAYS} days."
    replaced = freed.get(str(memory_id), [])
    # In the middle of a chain, what it replaced passes on to the next step.
    passed = memory_services.still_replaced(user_id=request.user.id, ids=replaced)
    count = len(replaced) - len(passed)
    if count:
        said += (
            " The memory it replaced is current again."
            if count == 1
            else f" The {count} memories it replaced are current again."
        )
    if passed:
        said += (
            " The memory it replaced stays replaced, by the memory that replaced this one."
            if len(passed) == 1
            else f" The {len(passed)} memories it replaced stay replaced, by the memory that"
            " replaced this one."
        )
    messages.success(request, said)
    return _back_to_memories(request)


HISTORY_PAGE = 50


@login_required
def changes(request: AuthenticatedRequest) -> HttpResponse:
    """The latest changes to any of the user's memories, deletions included, a page at a
    time: ``?before=`` a change pages back from it, ``?after=`` forward."""
    before, after = request.GET.get("before"), request.GET.get("after")
    try:
        page = memory_services.recent_changes(
            user_id=request.user.id, limit=HISTORY_PAGE, before=before, after=after
        )
    except ValidationFailed:
        # A cursor mangled in the address bar: the latest page, as for none.
        before = after = None
        page = memory_services.recent_changes(user_id=request.user.id, limit=HISTORY_PAGE)
    return render(
        request,
        "dashboard/changes.html",
        {
            "section": "memories",
            "changes": page["changes"],
            # Empty, an older page says there is nothing older; the latest, nothing yet.
            "paged": bool(before),
            "newer": page["newer"],
            "older": page["older"],
            "shown": HISTORY_PAGE,
            "retention_days": settings.HISTORY_RETENTION_DAYS,
        },
    )


def _offset(request: HttpRequest) -> int:
    """The page's ``offset`` query parameter: a count of rows to skip, else 0."""
    try:
        return max(0, int(request.GET.get("offset", 0)))
    except ValueError:
        return 0


@login_required
def memory_history(request: AuthenticatedRequest, memory_id: uuid.UUID) -> HttpResponse:
    try:
        versions = memory_services.memory_history(user_id=request.user.id, id=str(memory_id))
    except NotFound:
        raise Http404("No such memory.") from None
    user_id = request.user.id
    keys = {str(key.id): key for key in accounts_services.list_own_keys(user_id=user_id)}
    shown: list[dict[str, object]] = []
    named: set[str] = set()
    for version in versions:
        key = keys.get(version["api_key_id"] or "")
        label = f"{key.prefix}… {key.name}".strip() if key else None
        shown.append({**version, "key_label": label})
        # The memories it names, linked to their history pages where they have one.
        named.update(version["replaces"] or [])
        if version["superseded_by"]:
            named.add(version["superseded_by"])
    deleted = versions[-1]["action"] == "deleted"
    replaced = not deleted and bool(
        memory_services.still_replaced(user_id=user_id, ids=[str(memory_id)])
    )
    back = {"namespace": versions[-1]["namespace"], **({"replaced": "1"} if replaced else {})}
    return render(
        request,
        "dashboard/history.html",
        {
            "section": "memories",
            "memory_id": memory_id,
            "versions": list(reversed(shown)),  # newest first on the page
            "deleted": deleted,
            "replaced": replaced,
            "linkable": memory_services.with_history(user_id=user_id, ids=sorted(named)),
            "back": f"{reverse('dashboard:memories')}?{urlencode(back)}",
            "retention_days": settings.HISTORY_RETENTION_DAYS,
        },
    )


@login_required
@require_POST
def erase_history(request: AuthenticatedRequest, memory_id: uuid.UUID) -> HttpResponse:
    try:
        with context.acting_as("dashboard"):
            memory_services.erase_history(user_id=request.user.id, id=str(memory_id))
    except NotFound:
        raise Http404("No such history.") from None
    except Conflict:
        # The service's words name the MCP tools' purge; here the button is on this page.
        messages.error(
            request,
            "This memory still exists, so its history cannot be erased on its own."
            ' "Delete and erase history" below deletes the memory and erases its history'
            " together.",
        )
        return redirect(reverse("dashboard:memory-history", args=[memory_id]) + "#erase")
    messages.success(request, "History erased.")
    return redirect("dashboard:changes")


@login_required
def download_memories(request: AuthenticatedRequest) -> StreamingHttpResponse:
    """Every memory of the user's, with its history, as JSON Lines (``recall export``'s format)."""
    records = memory_services.export_memories(user_id=request.user.id)
    response = StreamingHttpResponse(
        transfer.to_lines(records), content_type="application/x-ndjson; charset=utf-8"
    )
    stamp = timezone.now().strftime("%Y-%m-%d")
    response["Content-Disposition"] = f'attachment; filename="recall-memories-{stamp}.jsonl"'
    response["Cache-Control"] = "no-store"
    return response


# Plan ------------------------------------------------------------------------------


@login_required
def plan(request: AuthenticatedRequest) -> HttpResponse:
    user = request.user
    current = tiers.rank(user.tier)
    offers = (
        [
            {"tier": tier, "label": tiers.Tier(tier).label}
            for tier in checkout.prices_by_tier()
            if tiers.rank(tier) > current
        ]
        if checkout.is_configured()
        else []
    )
    rows = [
        {
            "tier": limit.tier,
            "label": limit.label,
            "rate": limit.rate,
            "memories": memory_services.memory_limit(limit.tier),
            "current": limit.tier == user.tier,
        }
        for limit in accounts_services.rate_limits()
        # Unlimited is granted, not sold: shown only to those who have it.
        if tiers.is_billable(limit.tier) or limit.tier == user.tier
    ]
    response = render(
        request,
        "dashboard/plan.html",
        {
            "section": "plan",
            "tier_label": tiers.Tier(user.tier).label,
            "granted": not tiers.is_billable(user.tier),
            "rows": rows,
            "offers": offers,
            "stripe": checkout.is_configured(),
            "can_manage": checkout.is_configured() and bool(checkout.customer_id(user)),
            "subscriptions": billing_services.recent_subscriptions(user_id=user.id),
            "outcome": request.GET.get("checkout"),
        },
    )
    if checkout.is_configured():
        # Upgrade and Manage billing post here and are sent on to Stripe's pages.
        csp.allow_form_action(response, *checkout.PAGES)
    return response


@login_required
@require_POST
def start_checkout(request: AuthenticatedRequest) -> HttpResponse:
    if not checkout.is_configured():
        raise Http404("Payments are not configured.")
    back = request.build_absolute_uri(reverse("dashboard:plan"))
    try:
        url = checkout.start_checkout(
            user=request.user,
            tier=request.POST.get("tier", ""),
            success_url=f"{back}?checkout=success",
            cancel_url=f"{back}?checkout=cancelled",
        )
    except RecallError as exc:
        messages.error(request, exc.message)
        return redirect("dashboard:plan")
    return HttpResponseRedirect(url)


@login_required
@require_POST
def billing_portal(request: AuthenticatedRequest) -> HttpResponse:
    if not checkout.is_configured():
        raise Http404("Payments are not configured.")
    try:
        url = checkout.portal_url(
            user=request.user, return_url=request.build_absolute_uri(reverse("dashboard:plan"))
        )
    except RecallError as exc:
        messages.error(request, exc.message)
        return redirect("dashboard:plan")
    return HttpResponseRedirect(url)


class SignOutView(LogoutView):
    """Django's sign-out, which takes a POST; its GET asks to confirm with one."""

    http_method_names = ["get", "post", "options"]

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return render(request, "registration/logout_confirm.html")


# Sign-up ---------------------------------------------------------------------------


def signup(request: HttpRequest) -> HttpResponse:
    if not settings.SIGNUP_ENABLED:
        raise Http404("Sign-up is off.")
    if request.user.is_authenticated:
        return redirect("dashboard:usage")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = accounts_services.create_user(
                email=form.cleaned_data["email"], password=form.cleaned_data["password1"]
            )
        except RecallError as exc:
            form.add_error("email", exc.message)
        else:
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            return redirect("dashboard:keys")
    return render(request, "registration/signup.html", {"form": form})

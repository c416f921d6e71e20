"""The memories page's imports from other memory servers: the upload, and the jobs table.

An upload is queued for a background worker (memories/importers/job.py); a
refused one sends the browser back to the page it came from with the reason
(Post/Redirect/Get), and the page fetches the jobs table alone while an
import is on its way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from core import context
from core.errors import RecallError
from dashboard.forms import ImportForm
from dashboard.signed_in import AuthenticatedRequest
from memories import services as memory_services

# The session key under which a refused upload's options and reason wait for the page
# it is sent back to.
REFUSED_IMPORT = "dashboard.refused_import"


def import_context(request: AuthenticatedRequest) -> dict[str, Any]:
    jobs = memory_services.import_jobs(user_id=request.user.id)
    return {
        "import_jobs": jobs,
        "imports_running": any(job["status"] in ("queued", "running") for job in jobs),
        "import_max_mb": settings.IMPORT_UPLOAD_MAX_MB,
    }


def refused_import(request: AuthenticatedRequest) -> dict[str, Any]:
    """The import form, filled in as it was sent if that upload was just refused, and why."""
    refused = request.session.pop(REFUSED_IMPORT, None)
    if not isinstance(refused, dict):
        return {"import_form": ImportForm(), "import_error": None}
    return {
        "import_form": ImportForm(initial=refused.get("data") or {}),
        "import_error": refused.get("error"),
    }


@login_required
@require_GET
def import_jobs(request: AuthenticatedRequest) -> HttpResponse:
    """The imports table alone: what the memories page fetches while an import is on its way."""
    response = render(request, "dashboard/_import_jobs.html", import_context(request))
    response["Cache-Control"] = "no-store"
    return response


def _memories_url(request: AuthenticatedRequest) -> str:
    """The memories page the import form was on: its query (namespace, filters) is the
    form's action's, so that a refusal or a queued upload leads back to it."""
    query = request.GET.urlencode()
    return reverse("dashboard:memories") + (f"?{query}" if query else "") + "#imports"


def _refuse_import(
    request: AuthenticatedRequest, reason: str, form: ImportForm | None = None
) -> HttpResponse:
    """Send the browser back to the memories page with the reason (Post/Redirect/Get: a
    reload there shows the page again and never sends the file again)."""
    data: dict[str, Any] = {}
    if form is not None:
        data = {
            name: form.data.get(name, "")
            for name in ("format", "namespace", "columns", "ids")
            if isinstance(form.data.get(name, ""), str)
        }
        data["dry_run"] = form.data.get("dry_run") in ("on", "true", "1")
    request.session[REFUSED_IMPORT] = {"data": data, "error": f"Not imported. {reason}"}
    return HttpResponseRedirect(_memories_url(request))


def _form_errors(form: ImportForm) -> str:
    """A refused form's errors as one sentence or more, each field's named by its label."""
    said: list[str] = []
    for name, errors in form.errors.items():
        label = (form.fields[name].label or name.capitalize()) if name in form.fields else ""
        text = " ".join(str(error) for error in errors)
        said.append(f"{label}: {text}" if label else text)
    return " ".join(said)


def _checked(request: HttpRequest) -> HttpResponse:
    """What CsrfViewMiddleware is shown as the view to check: one not exempt from it."""
    raise AssertionError("never called")


def _csrf_refusal(request: AuthenticatedRequest) -> HttpResponse | None:
    """Django's own CSRF check (its 403 page when it fails), run inside the view."""
    return CsrfViewMiddleware(_checked).process_view(request, _checked, (), {})


# Exempt from the middleware's check only to run the same check itself, after the
# declared size: past the cap the server hands this view no body (recall/bodylimit.py),
# so the token a browser sends in the form is never seen, and a 403 "Form expired" stood
# in for the refusal. A request refused for its size changes nothing but that refusal's
# message in its own session; every other is checked before anything is read or queued.
@csrf_exempt
@login_required
@require_POST
def upload_import(request: AuthenticatedRequest) -> HttpResponse:
    """Queue an uploaded export for import; a worker runs it (memories/importers/job.py)."""
    from memories.importers.run import Options

    limit = settings.IMPORT_UPLOAD_MAX_MB * 1024 * 1024
    too_large = (
        f"That file is larger than the {settings.IMPORT_UPLOAD_MAX_MB} MB an upload may be. "
        "The operator can import it with `recall import --from` on the server."
    )
    # Refused by its declared size before the form parses a byte of it.
    if int(request.META.get("CONTENT_LENGTH") or 0) > limit + 64 * 1024:
        return _refuse_import(request, too_large)
    refused = _csrf_refusal(request)
    if refused is not None:
        return refused
    form = ImportForm(request.POST, request.FILES)
    if not form.is_valid():
        return _refuse_import(request, _form_errors(form), form)
    data = form.cleaned_data
    if data["file"].size > limit:
        return _refuse_import(request, too_large, form)
    filename = Path(data["file"].name).name
    options = {
        "format": data["format"],
        "namespace": data["namespace"] or "default",
        "ids": data["ids"] or None,
        "columns": data["columns"] or None,
        "dry_run": data["dry_run"],
    }
    try:
        Options(**options).check()
        with context.acting_as("dashboard"):
            memory_services.enqueue_import(
                user_id=request.user.id,
                tier=request.user.tier,
                filename=filename,
                options=options,
                chunks=data["file"].chunks(memory_services.IMPORT_CHUNK_BYTES),
            )
    except RecallError as exc:
        return _refuse_import(request, exc.message, form)
    messages.success(request, f"Importing {filename} in the background: its progress is below.")
    return HttpResponseRedirect(_memories_url(request))

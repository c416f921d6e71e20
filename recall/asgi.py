"""The one ASGI application uvicorn serves.

Routes, in order:

* ``GET /health``: liveness; answers from memory, touches no database.
* ``GET /ready``: readiness; 200 when the database answers and the embedding
  model is loaded, else 503 with the reason.
* ``/mcp`` and ``/agent/mcp``: the MCP endpoints (the five tools; seed 003's
  four, OAuth only), each through the gate below, then its own server's
  stateless Streamable HTTP handler with JSON responses. Served directly, so
  ``POST /mcp`` gets no 307 to ``/mcp/``.
* ``/v1/mcp``: seed 001's tool set (memories/v1_tools.py), behind the same
  gate as ``/mcp`` (API keys, or an OAuth token acting as its agent), on the
  same services.
* ``/.well-known/oauth-protected-resource[/mcp|/agent/mcp|/v1/mcp]``: each
  endpoint's RFC 9728 metadata (the root document describes ``/mcp``), from
  the SDK.
* ``/static/...``: the dashboard's own CSS, from the app static directories.
* everything else: Django (dashboard, admin, JSON API, webhooks).

This app, not Django, owns the ASGI lifespan: Django's handler refuses
lifespan events, and a mounted app's lifespan would never run. Startup runs
the MCP session managers, starts loading the embedding model, sizes the
worker-thread pool, starts the background workers (``JOB_WORKERS`` threads,
memories/jobs.py) and, on the embedded database, starts the supervisor that
restarts it if it dies; shutdown stops the workers and flushes queued usage
events.

The gate in front of ``/mcp``, in order: request id, Host check against
``ALLOWED_HOSTS`` and same-origin check of ``Origin`` (the SDK's own check is
off: it cannot express Django's ``.example.com`` or ``*`` entries, and by
default allows only localhost), POST only, bearer credential: an API key
where the endpoint takes keys, else an OAuth access token for this very
endpoint (401 with a challenge naming the endpoint's metadata; 503 with
``Retry-After`` when the database cannot say), JSON content type (415), an
``Accept`` that takes JSON, as the SDK's transports would ask (406), body
size (413), one well-formed JSON-RPC message (400, ``recall/jsonrpc.py``), an
``MCP-Protocol-Version`` the server speaks (400), and for a ``tools/call``
request (a notification runs no tool) the key's rate-limit admission
(``accounts/admission.py``: 429 with ``Retry-After``, recorded as a
``rate_limited`` usage event; the tool never runs). A refusal before
admission takes no token and leaves no usage event, so the media-type checks
the SDK makes are all made here first, and a JSON Content-Type the gate took
is spelled as the SDK's 2025-era transport asks. Every refusal, the SDK's
included, is a JSON-RPC error body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recall.settings")
django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.exceptions import SuspiciousOperation  # noqa: E402
from django.db import close_old_connections, connection  # noqa: E402
from django.http import FileResponse, Http404, HttpRequest  # noqa: E402
from django.http.request import split_domain_port, validate_host  # noqa: E402
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend  # noqa: E402
from mcp.server.auth.routes import create_protected_resource_routes  # noqa: E402
from mcp.server.streamable_http import check_accept_headers  # noqa: E402
from mcp.server.transport_security import TransportSecuritySettings  # noqa: E402
from pydantic import AnyHttpUrl  # noqa: E402
from starlette.requests import HTTPConnection, Request  # noqa: E402

from accounts import admission, auth, keys  # noqa: E402
from billing import usage  # noqa: E402
from core import context, errors, outage, stalls  # noqa: E402
from core import usage as core_usage  # noqa: E402
from core.workers import is_worker  # noqa: E402
from memories import embeddings, jobs  # noqa: E402
from memories.mcp import build_agent_server, build_server, build_v1_server  # noqa: E402
from memories.mcp.server import tool_names  # noqa: E402
from oauth import resources, tokens  # noqa: E402
from recall import bodylimit, jsonrpc, protocol  # noqa: E402
from recall.db import embedded  # noqa: E402
from recall.fastpath import FastPath  # noqa: E402
from recall.jsonrpc import (  # noqa: E402
    RPC_RATE_LIMITED,
    RPC_UNAUTHORIZED,
    refusal,
)

logger = logging.getLogger("recall.http")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
# What the gate answers instead of serving: status, JSON body, extra headers.
Refusal = tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]

MAX_BODY_BYTES = 1024 * 1024


@dataclass
class Endpoint:
    """One MCP endpoint: its server, its OAuth resource, and whether it takes API keys."""

    path: str
    sessions: Any
    verifier: BearerAuthBackend
    api_keys: bool
    # Answers stateless tools/call, tools/list and ping (recall/fastpath.py).
    fast: FastPath | None
    # The names of the server's tools; a usage event calls any other "unknown".
    tools: frozenset[str]


def build_endpoint(path: str, server: Any, *, api_keys: bool) -> Endpoint:
    server.streamable_http_app(
        streamable_http_path=path,
        stateless_http=True,
        json_response=True,
        max_request_body_size=MAX_BODY_BYTES,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    verifier = BearerAuthBackend(
        tokens.Verifier(path), resource_server_url=AnyHttpUrl(resources.identifier(path))
    )
    sessions = server.session_manager
    fast = FastPath(sessions) if settings.MCP_FAST_PATH else None
    return Endpoint(path, sessions, verifier, api_keys, fast, tool_names(server))


class StaticFiles(ASGIStaticFilesHandler):
    """Django's static files handler, where a path that climbs out of the static
    directories ("/static/../../etc/passwd") is a 404: Django raises
    SuspiciousFileOperation, which its handler lets out as a 500 and an error log."""

    def serve(self, request: HttpRequest) -> FileResponse:
        try:
            return super().serve(request)
        except SuspiciousOperation:
            raise Http404("Not found.") from None


class Recall:
    def __init__(self) -> None:
        self.django = get_asgi_application()
        # Every other request reaches Django with its body held to a cap (the
        # static files handler is Django's too: it reads a body all the same).
        self.static = bodylimit.Capped(StaticFiles(self.django))
        self.pages = bodylimit.Capped(self.django)
        self.endpoints = {
            # The five tools: API keys as before, or an OAuth token acting as its agent.
            resources.MCP_PATH: build_endpoint(resources.MCP_PATH, build_server(), api_keys=True),
            # Seed 003's tools: OAuth only, as that specification says.
            resources.AGENT_MCP_PATH: build_endpoint(
                resources.AGENT_MCP_PATH, build_agent_server(), api_keys=False
            ),
            # Seed 001's tools: the same callers as /mcp.
            resources.V1_MCP_PATH: build_endpoint(
                resources.V1_MCP_PATH, build_v1_server(), api_keys=True
            ),
        }
        self.metadata = protected_resource_metadata()
        self.workers: jobs.Workers | None = None
        self.embedder_error: str | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        try:
            scope = protocol.origin_form(scope)
        except protocol.BadTarget as bad:
            await send_json(send, 400, refusal("validation_failed", str(bad)))
            return
        path = scope.get("path", "")
        if scope["type"] == "http":
            if path == "/health":
                await send_json(send, 200, {"status": "ok"})
                return
            if path == "/ready":
                await self.ready(send)
                return
            endpoint = self.endpoints.get(path.rstrip("/") or "/")
            if endpoint is not None:
                await self.gate(endpoint, scope, receive, send)
                return
            if path in self.metadata:
                await self.metadata[path](scope, receive, send)
                return
            if path.startswith("/" + settings.STATIC_URL.lstrip("/")):
                await self.static(scope, receive, send)
                return
        await self.pages(scope, receive, send)

    # lifespan ------------------------------------------------------------------

    async def lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        supervisor = None
        try:
            async with contextlib.AsyncExitStack() as running:
                for endpoint in self.endpoints.values():
                    await running.enter_async_context(endpoint.sessions.run())
                limiter = anyio.to_thread.current_default_thread_limiter()
                limiter.total_tokens = settings.WORKER_THREADS
                threading.Thread(
                    target=self._load_embedder, name="embedder-load", daemon=True
                ).start()
                if settings.EMBEDDED_DATABASE and not is_worker():
                    # Ours to run, so ours to bring back if it dies (with
                    # several workers, the parent's: core/workers.py).
                    watcher = embedded.Supervisor(Path(settings.RECALL_DATA_DIR))
                    supervisor = await anyio.to_thread.run_sync(watcher.start)
                # A database that stops answering ends the calls waiting on it.
                stalls.install()
                self.workers = jobs.Workers().start()
                await send({"type": "lifespan.startup.complete"})
                await receive()  # lifespan.shutdown
                await anyio.to_thread.run_sync(self.workers.stop)
                if supervisor is not None:
                    await anyio.to_thread.run_sync(supervisor.stop)
                await anyio.to_thread.run_sync(usage.get_recorder().stop)
        except BaseException as exc:
            logger.error("startup failed", extra={"exc_type": type(exc).__name__})
            await send({"type": "lifespan.startup.failed", "message": "startup failed"})
            return
        await send({"type": "lifespan.shutdown.complete"})

    def _load_embedder(self) -> None:
        try:
            embeddings.get_embedder().load()
        except Exception as exc:
            self.embedder_error = type(exc).__name__
            logger.error("embedding model failed to load", extra={"exc_type": type(exc).__name__})

    # /ready --------------------------------------------------------------------

    async def ready(self, send: Send) -> None:
        checks = {"database": "ok", "embedder": "ok"}
        try:
            # On a thread limiter of its own: tool calls fill the default one
            # when the server is busy, and a busy server is not a down one.
            ping = anyio.to_thread.run_sync(_ping_database, limiter=_readiness_limiter())
            await asyncio.wait_for(ping, timeout=5)
        except Exception:
            checks["database"] = "unavailable: the database did not answer"
        embedder = embeddings.get_embedder()
        if not embedder.is_loaded:
            checks["embedder"] = (
                f"unavailable: the model failed to load ({self.embedder_error})"
                if self.embedder_error
                else "loading"
            )
        ok = all(value == "ok" for value in checks.values())
        body = {
            "status": "ready" if ok else "unavailable",
            "checks": checks,
            "usage_events": usage.get_recorder().stats(),
        }
        retry = [] if ok else [(b"retry-after", str(errors.UNAVAILABLE_RETRY_AFTER).encode())]
        await send_json(send, 200 if ok else 503, body, retry)

    # /mcp ----------------------------------------------------------------------

    async def gate(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        rid = context.new_request_id(header(scope, b"x-request-id"))
        extra_headers: list[tuple[bytes, bytes]] = [(b"x-request-id", rid.encode())]

        async def respond(message: Mapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra_headers]}
            await send(message)

        # Each step answers the refusals that are its own and returns None.
        caller = await identify(endpoint, scope, respond)
        if caller is None:
            return
        received = await receive_message(scope, receive, respond)
        if received is None:
            return
        body, message = received
        scope = with_json_media_type(scope)

        tool, call_id = tool_called(message)
        if tool is not None:
            tool = core_usage.tool_label(tool, endpoint.tools)
            admitted = await admission.aadmit(caller, tool=tool, request_id=rid)
            extra_headers.extend(
                (k.lower().encode(), v.encode()) for k, v in admitted.headers.items()
            )
            if admitted.error is not None:
                if admitted.event is not None:
                    usage.record(admitted.event)
                text = admitted.error.message
                limited = refusal("rate_limited", text, call_id, RPC_RATE_LIMITED)
                await send_json(respond, 429, limited)
                return

        auth_token = auth.current.set(caller)
        rid_token = context.request_id.set(rid)
        metering = core_usage.Metered()
        metered_token = core_usage.metered.set(metering)
        started = time.perf_counter()
        try:
            clean = jsonrpc.Clean(respond, message, scope.get("headers", ()))
            answered = endpoint.fast is not None and await endpoint.fast.answer(
                scope, replay(body), body, message, clean
            )
            if not answered:
                await endpoint.sessions.handle_request(scope, replay(body), clean)
            if tool is not None and not metering.recorded:
                # The SDK refused the call before the middleware that meters it.
                refused_unmetered(caller, tool, rid, started)
        finally:
            core_usage.metered.reset(metered_token)
            auth.current.reset(auth_token)
            context.request_id.reset(rid_token)


def refused_unmetered(caller: auth.AuthContext, tool: str, rid: str, started: float) -> None:
    """Record the usage event of a tools/call the SDK refused before the middleware that
    meters every call it sees (a 2026-era call without its envelope)."""
    elapsed_ms = int((time.perf_counter() - started) * 1000)
    usage.record(
        core_usage.event_of(
            caller, tool, request_id=rid, error_code="validation_failed", latency_ms=elapsed_ms
        )
    )


async def identify(endpoint: Endpoint, scope: Scope, respond: Send) -> auth.AuthContext | None:
    """Screen the request and authenticate its credential; answer and return None if refused."""
    refused = screen(scope)
    if refused is not None:
        await send_json(respond, *refused)
        return None
    raw = bearer(scope)
    try:
        caller = await credential(endpoint, scope, raw) if raw else None
    except Exception as exc:
        if not errors.is_outage(exc):
            raise
        # Never 401 (that says the credential is bad) and never 500: it may
        # be fine, and the same request can succeed once the database is back.
        outage.note("authentication", exc)
        await send_json(respond, *unavailable())
        return None
    if caller is None:
        await send_json(respond, *unauthorized(endpoint, raw, header(scope, b"host")))
    return caller


async def credential(endpoint: Endpoint, scope: Scope, raw: str) -> auth.AuthContext | None:
    """Return who a bearer credential acts for at ``endpoint``, or None to refuse it.

    An API key (``recall_live_...``) works where the endpoint takes keys. Any
    other bearer is an OAuth access token, checked by the MCP SDK's bearer
    backend: known, live, unexpired, and bound to this endpoint (RFC 8707).
    """
    if keys.is_well_formed(raw):
        return await authenticate(raw) if endpoint.api_keys else None
    verified = await endpoint.verifier.authenticate(HTTPConnection(scope))
    if verified is None:
        return None
    _, user = verified
    return tokens.caller(user.access_token)


# What each endpoint's RFC 9728 document calls it: the tools it serves.
RESOURCE_NAMES = {
    resources.MCP_PATH: "Recall",
    resources.AGENT_MCP_PATH: "Recall (agent tools)",
    resources.V1_MCP_PATH: "Recall (v1 tools)",
}


def protected_resource_metadata() -> dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]]:
    """Return the RFC 9728 documents by path: each endpoint's, and the root one (``/mcp``'s)."""
    documents: dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]] = {}
    for path in resources.PATHS:
        document = MetadataDocument(path)
        documents[urlsplit(resources.metadata_url(path)).path] = document
        if path == resources.MCP_PATH:
            documents["/.well-known/oauth-protected-resource"] = document
    return documents


class MetadataDocument:
    """One endpoint's RFC 9728 document, from the SDK, naming the endpoint as the request did.

    On a loopback public URL a client given ``localhost`` reads the document
    at ``localhost`` and refuses one whose resource says ``127.0.0.1``; each
    loopback name gets its own document (oauth/resources.py says which).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        # By resource: the public URL, and at most a few loopback spellings of it.
        self.apps: dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        resource = resources.identifier(self.path, header(scope, b"host"))
        app = self.apps.get(resource)
        if app is None:
            # A string, not AnyHttpUrl: the metadata model keeps a bare origin without
            # the trailing slash pydantic would add, so it equals the issuer exactly.
            issuer: Any = settings.RECALL_PUBLIC_URL
            [route] = create_protected_resource_routes(
                resource_url=AnyHttpUrl(resource),
                authorization_servers=[issuer],
                scopes_supported=[resources.SCOPE],
                resource_name=RESOURCE_NAMES[self.path],
            )
            app = self.apps[resource] = route.app
        await app(scope, receive, send)


async def receive_message(
    scope: Scope, receive: Receive, respond: Send
) -> tuple[bytes, dict[str, Any]] | None:
    """Read the body and parse its one JSON-RPC message; answer and return None if refused."""
    if not jsonrpc.is_json(header(scope, b"content-type")):
        message = jsonrpc.UNSUPPORTED_MEDIA_TYPE
        await send_json(respond, 415, refusal("validation_failed", message))
        return None
    if not accepts_json(scope):
        await send_json(respond, 406, refusal("validation_failed", jsonrpc.NOT_ACCEPTABLE))
        return None
    if (header(scope, b"content-encoding") or "identity").strip().lower() != "identity":
        message = jsonrpc.UNSUPPORTED_ENCODING
        await send_json(respond, 415, refusal("validation_failed", message))
        return None
    # A body announced too long is refused before a byte is read, as Django's
    # side does (bodylimit.py): reading would wait for the request deadline.
    too_long = declared_too_long(header(scope, b"content-length"))
    body = b"" if too_long else await read_body(receive)
    if body is None:  # the client went away
        return None
    if too_long or len(body) > MAX_BODY_BYTES:
        await send_json(respond, 413, refusal("validation_failed", "Request body too large."))
        return None
    try:
        parsed = jsonrpc.parse(body)
        jsonrpc.check_version(header(scope, b"mcp-protocol-version"), parsed)
    except jsonrpc.Invalid as invalid:
        await send_json(respond, 400, invalid.body())
        return None
    return body, parsed


# helpers ---------------------------------------------------------------------------


def _endpoint(path: str, server: Any) -> Any:
    """Mount ``server`` as a stateless JSON Streamable HTTP endpoint; return its sessions."""
    server.streamable_http_app(
        streamable_http_path=path,
        stateless_http=True,
        json_response=True,
        max_request_body_size=MAX_BODY_BYTES,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return server.session_manager


def declared_too_long(value: str | None) -> bool:
    """Whether a Content-Length header announces more than ``MAX_BODY_BYTES``."""
    digits = (value or "").strip()
    if not (digits.isascii() and digits.isdigit()):
        return False
    significant = digits.lstrip("0")  # int() refuses thousands of digits
    return len(significant) > 20 or int(significant or "0") > MAX_BODY_BYTES


# Headers a request may carry once: a second copy that disagrees with the
# first would be read one way here and perhaps the other way by a proxy.
SINGLE_HEADERS = (
    b"authorization",
    b"origin",
    b"content-type",
    b"mcp-protocol-version",
    b"mcp-method",
    b"mcp-name",
)


def repeated_header(scope: Scope) -> str | None:
    """Return the name of a header ``SINGLE_HEADERS`` lists that the request repeats."""
    names = [key for key, _ in scope.get("headers", []) if key in SINGLE_HEADERS]
    twice = next((name for name in SINGLE_HEADERS if names.count(name) > 1), None)
    return twice.decode("latin-1") if twice else None


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


def bearer(scope: Scope) -> str | None:
    value = header(scope, b"authorization") or ""
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def screen(scope: Scope) -> Refusal | None:
    """Refuse a request whose Host, Origin or method /mcp never serves, before any auth."""
    domain, _ = split_domain_port(header(scope, b"host") or "")
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return 421, refusal("validation_failed", "Invalid Host header."), []
    twice = repeated_header(scope)
    if twice:
        message = f"The {twice.title()} header may be sent once."
        return 400, refusal("validation_failed", message), []
    origin = header(scope, b"origin")
    if origin and not origin_allowed(origin, scope):
        return 403, refusal("validation_failed", "Origin not allowed."), []
    if scope["method"] != "POST":
        # Stateless with JSON responses: no server-to-client stream to GET,
        # no session to DELETE.
        body = refusal("validation_failed", "Use POST for MCP requests.")
        return 405, body, [(b"allow", b"POST")]
    return None


# An OAuth token refused at any endpoint: a token, never "an API key".
REFUSED_BEARER = (
    "Invalid or expired OAuth access token for this endpoint: connect again to get one."
)


def unauthorized(endpoint: Endpoint, raw: str | None, host: str | None = None) -> Refusal:
    """Refuse a missing or bad credential, pointing the client at this endpoint's metadata.

    The message is the same whether a credential is missing, unknown, revoked
    or expired: it must not tell a guesser which. It does follow what was
    sent: a bearer not shaped like an API key was checked as an OAuth access
    token, so it is called a token, on every endpoint. The metadata is named
    at the loopback name the request used, on a loopback public URL
    (oauth/resources.py).
    """
    metadata = resources.metadata_url(endpoint.path, host)
    challenge = f'Bearer realm="recall", resource_metadata="{metadata}", scope="{resources.SCOPE}"'
    if raw:
        challenge += ', error="invalid_token"'
    if raw and keys.is_well_formed(raw) and not endpoint.api_keys:
        message = (
            "This endpoint takes OAuth access tokens, not API keys: connect with the URL alone "
            f"and approve the connection in the browser, or use {resources.MCP_PATH} with a key."
        )
    elif raw and not raw.startswith(keys.KEY_PREFIX):
        message = REFUSED_BEARER
    elif endpoint.api_keys:
        message = "Missing or invalid API key. Send Authorization: Bearer recall_live_..."
    else:
        message = "Missing or invalid OAuth access token for this endpoint."
    body = refusal("unauthorized", message, rpc_code=RPC_UNAUTHORIZED)
    return 401, body, [(b"www-authenticate", challenge.encode())]


def origin_allowed(origin: str, scope: Scope) -> bool:
    """Return whether a browser page at ``origin`` may call us: same origin, or trusted.

    Same origin means scheme, host and port all match the request's own, as
    Django's CSRF check has it; CSRF_TRUSTED_ORIGINS lists any others.
    """
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    try:
        parsed = urlsplit(origin)
        origin_port = parsed.port
    except ValueError:
        return False
    if not parsed.scheme or not parsed.hostname:
        return False
    scheme = scope.get("scheme", "http")
    host, port = split_domain_port(header(scope, b"host") or "")
    default = {"http": 80, "https": 443}.get(scheme)
    return (
        parsed.scheme.lower() == scheme
        and parsed.hostname.lower().strip("[]") == host.strip("[]")
        and (origin_port or default) == (int(port) if port.isdigit() else default)
    )


def accepts_json(scope: Scope) -> bool:
    """Whether the request's ``Accept`` takes JSON, the only body we answer with.

    It must name it (``application/json``, ``application/*`` or ``*/*``: a
    missing Accept names none), as both of the SDK's transports read it, and
    must not give it a q of 0. Refused here, a request takes no rate-limit
    token and leaves no usage event; the SDK's own 406 came after both.
    """
    names_json, _ = check_accept_headers(Request(scope))
    return names_json and not refuses_json(header(scope, b"accept"))


def with_json_media_type(scope: Scope) -> Scope:
    """``scope`` with its Content-Type's media type spelled ``application/json``.

    Media types are case-insensitive (RFC 9110 8.3.1) and the gate took
    ``Application/JSON``, as the 2026-era transport does; the 2025-era one
    compares the spelling and refused it with 415, a call already metered.
    Its parameters are kept, and a request that spells it so is left as sent.
    """
    headers = list(scope.get("headers", []))
    for index, (name, value) in enumerate(headers):
        if name != b"content-type":
            continue
        media_type, semicolon, parameters = bytes(value).partition(b";")
        if media_type.strip() == b"application/json":
            return scope
        headers[index] = (name, b"application/json" + semicolon + parameters)
        return {**scope, "headers": headers}
    return scope


def refuses_json(accept: str | None) -> bool:
    """Whether ``accept`` gives JSON, the only body we answer with, a q of 0.

    The most specific range that matches decides (RFC 9110 12.5.1):
    ``application/json;q=0`` refuses even beside ``*/*``. The SDK's own check
    (``accepts_json`` asks it first) reads no weights: it asks that JSON be
    named at all.
    """
    if "q" not in (accept or "").lower():
        return False  # no weights: JSON is refused only by leaving it out
    best = (-1, 1.0)
    for part in (accept or "").split(","):
        media, *params = (piece.strip().lower() for piece in part.split(";"))
        rank = {"application/json": 2, "application/*": 1, "*/*": 0}.get(media)
        if rank is None or rank < best[0]:
            continue
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 1.0
        best = (rank, weight)
    return best[0] >= 0 and best[1] <= 0


def unavailable() -> Refusal:
    wait = errors.UNAVAILABLE_RETRY_AFTER
    message = f"The service is unavailable right now. Retry in {wait} s."
    body = refusal("unavailable", message, rpc_code=jsonrpc.RPC_UNAVAILABLE)
    return 503, body, [(b"retry-after", str(wait).encode())]


async def authenticate(raw_key: str) -> auth.AuthContext | None:
    cached = auth.cached(raw_key)
    if cached is not None:
        return cached
    caller = await auth.aauthenticate(raw_key)
    outage.recovered("authentication")  # the database answered
    return caller


async def read_body(receive: Receive) -> bytes | None:
    """Return the body, cut short just past MAX_BODY_BYTES; None if the client went away."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        chunks.append(chunk)
        if size > MAX_BODY_BYTES or not message.get("more_body"):
            return b"".join(chunks)


def replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()  # the SDK never reads past the body
        raise AssertionError("unreachable")

    return receive


def tool_called(message: dict[str, Any]) -> tuple[str | None, Any]:
    """Return the tool a JSON-RPC ``tools/call`` request names and the call's id.

    Other messages give (None, None) and are left to the SDK to answer: a
    notification named ``tools/call`` too, which runs nothing.
    """
    if message.get("method") != "tools/call" or "id" not in message:
        return None, None
    params = message.get("params") or {}
    name = params.get("name")
    return (name if isinstance(name, str) else ""), jsonrpc.call_id(message)


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"cache-control", b"no-store"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


_readiness_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter]
_readiness_limiters = weakref.WeakKeyDictionary()


def _readiness_limiter() -> anyio.CapacityLimiter:
    """/ready's own thread limiter, one per event loop (a limiter waits on its loop)."""
    loop = asyncio.get_running_loop()
    limiter = _readiness_limiters.get(loop)
    if limiter is None:
        limiter = _readiness_limiters[loop] = anyio.CapacityLimiter(2)
    return limiter


def _ping_database() -> None:
    close_old_connections()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()


application = Recall()

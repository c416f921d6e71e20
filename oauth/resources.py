"""Recall's OAuth-protected resources, and how each is named to clients.

Three MCP endpoints accept OAuth access tokens:

* ``/mcp``, the five-tool endpoint, which also takes API keys;
* ``/agent/mcp``, seed 003's tools, which takes OAuth tokens only;
* ``/v1/mcp``, seed 001's tools, which also takes API keys.

Each is its own protected resource (RFC 9728): its identifier is the public
URL of the endpoint, its metadata lives at the path-inserted well-known URL
(``/.well-known/oauth-protected-resource/mcp``), and a token is bound to
exactly one of them by the ``resource`` the client asked for (RFC 8707). The
root metadata document (``/.well-known/oauth-protected-resource``) describes
``/mcp``, for clients that look only there.

When the public URL is a loopback one (the default: ``http://127.0.0.1:PORT``),
``localhost``, ``127.0.0.1`` and ``[::1]`` all name this server, and a client
may have been given any of them. The SDK's client refuses a metadata document
whose resource is not the URL it was given, so the document, and the 401's
pointer to it, name the endpoint at the loopback name the request used; an
identifier at one loopback name is the same resource as at another (same
scheme, port and path), so a token bound to one is good at the others. A
public URL that is not loopback has no aliases.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from mcp.server.auth.routes import build_resource_metadata_url
from pydantic import AnyHttpUrl

MCP_PATH = "/mcp"
AGENT_MCP_PATH = "/agent/mcp"
V1_MCP_PATH = "/v1/mcp"
PATHS = (MCP_PATH, AGENT_MCP_PATH, V1_MCP_PATH)
# The one scope: read and write the connection's agent's memory.
SCOPE = "memory"


# The names a loopback public URL is also reached by (RFC 8252 section 8.3 lists them).
LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}
DEFAULT_PORTS = {"http": 80, "https": 443}


def identifier(path: str, host: str | None = None) -> str:
    """Return the resource identifier (and public URL) of the endpoint at ``path``.

    With ``host`` (a request's Host header) that names this server by another
    loopback name than the public URL's, the endpoint's identifier at that name.
    """
    return (_loopback_origin(host) or settings.RECALL_PUBLIC_URL) + path


def identifiers() -> list[str]:
    return [identifier(path) for path in PATHS]


def metadata_url(path: str, host: str | None = None) -> str:
    """Return where the endpoint's protected-resource metadata lives (RFC 9728 section 3.1)."""
    return str(build_resource_metadata_url(AnyHttpUrl(identifier(path, host))))


def _loopback_origin(host: str | None) -> str | None:
    """Return the public URL's origin at the loopback name ``host`` gives, or None.

    None unless the public URL is loopback and ``host`` is a loopback name with
    the public URL's port: only then do both name this very server. The origin
    is rebuilt from the checked parts, never copied from the header.
    """
    public = urlsplit(settings.RECALL_PUBLIC_URL)
    if not host or not _is_loopback(public.hostname):
        return None
    try:
        given = urlsplit("//" + host)
        port = given.port or DEFAULT_PORTS.get(public.scheme.lower())
    except ValueError:
        return None
    name = (given.hostname or "").lower()
    if given.netloc.lower() != host.lower() or name not in LOOPBACK_HOSTS:
        return None
    if port != _port(public) or given.username is not None or given.path:
        return None
    # Spelled as the client spelled it (a port only if it gave one): the SDK
    # compares the document's resource with its URL as strings.
    shown = (f"[{name}]" if ":" in name else name) + (f":{given.port}" if given.port else "")
    return f"{public.scheme.lower()}://{shown}"


def _is_loopback(hostname: str | None) -> bool:
    return (hostname or "").lower() in LOOPBACK_HOSTS


def same(left: str, right: str) -> bool:
    """Compare two resource URLs as URLs: case of scheme and host, and a trailing slash, aside.

    Two loopback names are one host when the public URL is loopback: the
    same endpoint reached as ``localhost`` or ``127.0.0.1`` is one resource.
    A resource never has a fragment (RFC 8707 section 2): one with any is no resource.
    """
    if "#" in left or "#" in right:
        return False
    a, b = urlsplit(left), urlsplit(right)
    aliases = _is_loopback(urlsplit(settings.RECALL_PUBLIC_URL).hostname)
    return (
        a.scheme.lower() == b.scheme.lower()
        and (
            (a.hostname or "") == (b.hostname or "")
            or (aliases and _is_loopback(a.hostname) and _is_loopback(b.hostname))
        )
        and _port(a) == _port(b)
        and a.path.rstrip("/") == b.path.rstrip("/")
        and a.query == b.query
    )


def _port(parts: object) -> int | None:
    try:
        port = parts.port  # type: ignore[attr-defined]
    except ValueError:
        return None
    scheme = parts.scheme.lower()  # type: ignore[attr-defined]
    return port or DEFAULT_PORTS.get(scheme)


def is_known(uri: str) -> bool:
    return any(same(uri, known) for known in identifiers())

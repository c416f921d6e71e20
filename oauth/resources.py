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


def identifier(path: str) -> str:
    """Return the resource identifier (and public URL) of the endpoint at ``path``."""
    return settings.RECALL_PUBLIC_URL + path


def identifiers() -> list[str]:
    return [identifier(path) for path in PATHS]


def metadata_url(path: str) -> str:
    """Return where the endpoint's protected-resource metadata lives (RFC 9728 section 3.1)."""
    return str(build_resource_metadata_url(AnyHttpUrl(identifier(path))))


def same(left: str, right: str) -> bool:
    """Compare two resource URLs as URLs: case of scheme and host, and a trailing slash, aside.

    A resource never has a fragment (RFC 8707 section 2): one with any is no resource.
    """
    if "#" in left or "#" in right:
        return False
    a, b = urlsplit(left), urlsplit(right)
    return (
        a.scheme.lower() == b.scheme.lower()
        and (a.hostname or "") == (b.hostname or "")
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
    return port or {"http": 80, "https": 443}.get(scheme)


def is_known(uri: str) -> bool:
    return any(same(uri, known) for known in identifiers())

"""Fetching Client ID Metadata Documents, safely.

A client may name itself by an https URL (its ``client_id``) whose JSON
document lists its name and redirect URIs. The toolkit resolves such ids,
validates the document (the ``client_id`` inside must equal the URL, public
clients only, at least one redirect URI), stores it as an application and
refreshes it when its cache lifetime ends; the redirect URI of every
authorization request is then checked against the document's list.

Fetching is ours, because the URL is chosen by whoever starts an
authorization request, and the fetch happens before anyone has signed in:

* https only, on the URL's own port; no user-info, fragment or dot segments;
* the host is resolved once, and every address it resolves to must be
  public: loopback, private, link-local (cloud metadata), CGNAT, multicast
  and reserved addresses are refused before any connection is made, and
  the connection goes to the checked address, so a second DNS answer cannot
  redirect it (certificate and SNI still use the host name);
* one request, no redirects followed, a deadline for the whole fetch and a
  size cap on the body (the toolkit's ``CIMD_FETCH_TIMEOUT_SECONDS`` and
  ``CIMD_MAX_DOCUMENT_SIZE``), JSON only.

``OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES`` lifts the address rule, for
development and tests on one machine only. https stays required.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

import urllib3
from django.conf import settings
from oauth2_provider.cimd import CIMDError
from oauth2_provider.settings import oauth2_settings


def check_url(client_id: str) -> tuple[str, int, str]:
    """Return the host, port and request target of a metadata document URL, or raise."""
    parts = urlsplit(client_id)
    if parts.scheme != "https":
        raise CIMDError("a client metadata document must be served over https")
    if not parts.hostname:
        raise CIMDError("the client_id URL has no host")
    if parts.username is not None or parts.password is not None:
        raise CIMDError("the client_id URL must not carry user information")
    if parts.fragment:
        raise CIMDError("the client_id URL must not have a fragment")
    if not parts.path or parts.path == "/":
        raise CIMDError("the client_id URL must have a path")
    if any(segment in (".", "..") for segment in parts.path.split("/")):
        raise CIMDError("the client_id URL must not have dot segments")
    try:
        port = parts.port or 443
    except ValueError:
        raise CIMDError("the client_id URL has an invalid port") from None
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, port, target


def is_public(address: str) -> bool:
    """Say whether ``address`` is globally routable, looking inside IPv6 forms that embed IPv4."""
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.teredo is not None:
            return all(part.is_global for part in ip.teredo)
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in ipaddress.ip_network("64:ff9b::/96"):
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            ip = embedded
    return ip.is_global


def resolve(host: str, port: int) -> list[str]:
    """Return the addresses to try for ``host``; refuse them all if any one is not public."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise CIMDError("the client_id host does not resolve") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise CIMDError("the client_id host does not resolve")
    if not settings.OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES:
        for address in addresses:
            if not is_public(address):
                # One private answer condemns the host: a mixed answer is how
                # DNS rebinding slips an internal address past a check.
                raise CIMDError(f"the client_id host resolves to a non-public address ({address})")
    return addresses


def max_age(cache_control: str | None) -> int:
    """Return how long to trust a document, from its Cache-Control, within the configured bounds."""
    low = oauth2_settings.CIMD_METADATA_MIN_AGE_SECONDS
    high = oauth2_settings.CIMD_METADATA_MAX_AGE_SECONDS
    age = high
    directives = [part.strip().lower() for part in (cache_control or "").split(",")]
    if "no-store" in directives or "no-cache" in directives:
        age = low
    for directive in directives:
        name, _, value = directive.partition("=")
        if name.strip() == "max-age" and value.strip().isdigit():
            age = int(value.strip())
    return max(low, min(age, high))


class MetadataFetcher:
    """The toolkit's ``CIMD_METADATA_FETCHER``: ``fetch(client_id)`` returns (document, max_age)."""

    def fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        host, port, target = check_url(client_id)
        addresses = resolve(host, port)
        deadline = time.monotonic() + oauth2_settings.CIMD_FETCH_TIMEOUT_SECONDS
        context = ssl.create_default_context()
        problem: Exception | None = None
        for address in addresses:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            pool = urllib3.HTTPSConnectionPool(
                host=address,
                port=port,
                timeout=urllib3.Timeout(total=left),
                retries=False,
                maxsize=1,
                ssl_context=context,
                server_hostname=host,
                assert_hostname=host,
            )
            try:
                response = pool.urlopen(
                    "GET",
                    target,
                    headers={"Host": _host_header(host, port), "Accept": "application/json"},
                    redirect=False,
                    preload_content=False,
                )
                try:
                    return self.read(response)
                finally:
                    response.release_conn()
            except urllib3.exceptions.HTTPError as exc:
                problem = exc
            finally:
                pool.close()
        raise CIMDError(f"the client metadata document could not be fetched ({problem!r})")

    def read(self, response: Any) -> tuple[dict[str, Any], int]:
        if response.status != 200:
            # Redirects included: a document lives at its own URL, nowhere else.
            raise CIMDError(f"the client metadata document answered HTTP {response.status}")
        kind = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if kind != "application/json" and not (
            kind.startswith("application/") and kind.endswith("+json")
        ):
            raise CIMDError("the client metadata document is not JSON")
        limit = oauth2_settings.CIMD_MAX_DOCUMENT_SIZE
        body = response.read(limit + 1)
        if len(body) > limit:
            raise CIMDError(f"the client metadata document is larger than {limit} bytes")
        try:
            document = json.loads(body)
        except ValueError:
            raise CIMDError("the client metadata document is not valid JSON") from None
        if not isinstance(document, dict):
            raise CIMDError("the client metadata document must be a JSON object")
        return document, max_age(response.headers.get("Cache-Control"))


def _host_header(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port == 443 else f"{shown}:{port}"

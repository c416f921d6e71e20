"""Fetching Client ID Metadata Documents: the toolkit's hardened fetcher, and a development switch.

A client may name itself by an https URL (its ``client_id``) whose JSON
document lists its name and redirect URIs. django-oauth-toolkit resolves such
ids, validates and caches the documents (the ``CIMD_*`` settings) and checks
every authorization request's redirect URI against the document. Its
``SafeMetadataFetcher`` does the fetching, and Recall uses it unchanged: the
URL is chosen by whoever starts an authorization request, before anyone has
signed in, so it takes https only, refuses a host any of whose addresses is
not public (loopback, private, link-local and cloud-metadata, CGNAT, and the
IPv6 forms that embed them) before connecting, connects to the address it
checked, follows no redirect, and bounds the whole fetch by a deadline and
the body by a size cap.

``OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES`` exists for development and tests on
one machine, where the document is served from loopback. It lifts the
address rule and nothing else: https with a trusted certificate, one request
without redirects, the deadline, the size cap and the JSON checks all hold.

A fetched document's metadata is then checked as a registration's is
(``registration.metadata_problem``): a redirect URI no client could own, or a
name that hides characters, refuses the client however it was named.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any
from urllib.parse import urlsplit

import urllib3
from django.conf import settings
from oauth2_provider.cimd import CIMDError, SafeMetadataFetcher
from oauth2_provider.settings import oauth2_settings

from accounts import admission
from core import addresses
from oauth import registration, services

logger = logging.getLogger(__name__)


class FirstSightLimit:
    """The toolkit's ``CIMD_REGISTRATION_PERMISSION_CLASSES``: a first fetch, paced per address.

    The toolkit asks it before fetching a ``client_id`` no stored client has.
    Without it one address could make the server fetch, and store as a client,
    any number of URLs of its choosing, each a log line when refused: open
    registration without its limits (review146).
    """

    def has_permission(self, request: Any, client_id: str) -> bool:
        # The toolkit asks again before it fetches a stored client's stale
        # document: that is no new client, and is not paced (review148).
        if services.find_application(client_id=client_id) is not None:
            return True
        meta = getattr(request, "headers", None) or {}
        address = addresses.address_from_meta(meta)
        wait = admission.new_client_document(address)
        if wait:
            logger.warning(
                "oauth: too many new client metadata documents from one address",
                extra={"address": address, "retry_after": wait},
            )
        return not wait


class MetadataFetcher(SafeMetadataFetcher):
    """The toolkit's ``CIMD_METADATA_FETCHER``: ``fetch(client_id)`` returns (document, max_age)."""

    def fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        try:
            return self._checked_fetch(client_id)
        except CIMDError as exc:
            # One line an operator can act on; the consent page only says the
            # document could not be used. The reason is our words or the
            # toolkit's, never the document's content.
            logger.warning(
                "oauth: client metadata document refused",
                extra={"client_id": client_id[:300], "reason": str(exc)[:300]},
            )
            raise

    def _checked_fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        if settings.OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES:
            document, max_age = self._fetch_from_any_address(client_id)
        else:
            document, max_age = super().fetch(client_id)
        # A document is registration by another road: what it lists is held
        # to the rules a registered client's metadata is (redirect URIs a
        # client could own, a printable name, https informational URIs).
        problem = registration.metadata_problem(document)
        if problem is not None:
            raise CIMDError(f"client_id document: {problem[1]}")
        return document, max_age

    def _fetch_from_any_address(self, client_id: str) -> tuple[dict[str, Any], int]:
        parts = urlsplit(client_id)
        if parts.scheme != "https" or not parts.hostname:
            raise CIMDError("client_id URL must use the https scheme and name a host")
        deadline = oauth2_settings.CIMD_FETCH_TIMEOUT_SECONDS
        pool = urllib3.PoolManager(
            retries=False,
            timeout=urllib3.Timeout(connect=deadline, read=deadline, total=deadline),
            ssl_context=ssl.create_default_context(),
        )
        try:
            response = pool.request(
                "GET",
                client_id,
                headers={"Accept": "application/json"},
                redirect=False,
                preload_content=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise CIMDError(f"could not fetch client_id document: {exc}") from None
        try:
            document: tuple[dict[str, Any], int] = self._read_document(response)
            return document
        finally:
            response.release_conn()
            pool.clear()

"""Which client a request comes from, as the limits that count by address see it."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from django.http import HttpRequest


def client_address(request: HttpRequest) -> str | None:
    """Return the address a request is counted by, or None when there is none.

    uvicorn puts a trusted proxy's X-Forwarded-For in REMOTE_ADDR. An IPv6
    client commonly holds a whole /64, so that network counts as one address.
    """
    return address_from_meta(request.META)


def address_from_meta(meta: Mapping[str, Any]) -> str | None:
    """``client_address`` from a request's META (oauthlib's requests carry a copy of it)."""
    try:
        address = ipaddress.ip_address(str(meta.get("REMOTE_ADDR", "")))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False).network_address)
    return str(address)

"""The Content-Security-Policy of the pages this server renders.

Every HTML page (dashboard, sign-in, consent, admin) gets ``POLICY``: scripts,
styles, images and fonts from this server only, none inline; no plugins; no
``<base>`` elsewhere; no framing; and forms that submit only here.
``recall.middleware.ContentSecurityPolicyMiddleware`` adds it, and
``PERMISSIONS``, which refuses the browser features no page uses (camera,
microphone, location, payment and the like). Nothing
needs more: the templates hold no inline script, event handler or style
attribute (what little runs is ``dashboard/static/dashboard/recall.js``), and
Django's admin runs from its static files too.

``form-action`` needs one allowance. Chromium applies it to every redirect
that follows a form's submission, not only to the form's own ``action``, so
a form that posts here and is answered with a redirect elsewhere is blocked
unless the policy names the destination too. Two pages post like that: the
consent page (Allow and Cancel send the browser on to the client's redirect
URI) and the plan page (checkout and the billing portal are Stripe's pages).
So does the sign-in page on the way to an authorization request that skips
the consent page (``oauth.views.SignInView``). They call
``allow_form_action`` with exactly where they lead.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from django.http import HttpResponseBase

HEADER = "Content-Security-Policy"
FORM_ACTION = "form-action 'self'"
POLICY = (
    f"default-src 'self'; object-src 'none'; base-uri 'self'; {FORM_ACTION}; frame-ancestors 'none'"
)
# The browser features no page of this server uses, refused to everything on
# it (a script injected despite the policy above, an extension's frame):
# sent with the policy, as ``Permissions-Policy``.
PERMISSIONS_HEADER = "Permissions-Policy"
PERMISSIONS = ", ".join(
    f"{feature}=()"
    for feature in (
        "accelerometer",
        "camera",
        "display-capture",
        "geolocation",
        "gyroscope",
        "magnetometer",
        "microphone",
        "midi",
        "payment",
        "publickey-credentials-get",
        "serial",
        "usb",
    )
)
# A host a CSP source can name: a DNS name or an IPv4 address.
_HOST = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")
# Schemes whose URLs the browser runs or reads itself: never a form's destination.
_BROWSER_SCHEMES = {"javascript", "data", "blob", "filesystem", "file", "about"}


def source(uri: str) -> str | None:
    """Return the narrowest CSP source that matches ``uri``, or None if none can.

    An http(s) URI gives its origin (``https://client.example``,
    ``http://127.0.0.1:33418``); a private-use scheme such as ``cursor://``
    gives the scheme (``cursor:``), the only source Chromium matches it by
    (``cursor://host`` matches nothing).
    """
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if not _SCHEME.match(scheme) or scheme in _BROWSER_SCHEMES:
        return None
    if scheme not in ("http", "https"):
        return f"{scheme}:"
    if _HOST.match(host):
        return f"{scheme}://{host}" + (f":{port}" if port is not None else "")
    if _is_ipv6(host):
        # Chromium takes no IPv6 literal as a source ("http://[::1]:8080" is
        # ignored), so a native client on [::1] is allowed by scheme alone.
        return f"{scheme}:"
    return None


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def allow_form_action(response: HttpResponseBase, *uris: str) -> None:
    """Let the forms on ``response``'s page lead to ``uris`` as well as to this server."""
    extra = [found for uri in uris if (found := source(uri))]
    response[HEADER] = POLICY.replace(FORM_ACTION, " ".join([FORM_ACTION, *extra]))

"""What a client may register as a redirect URI, and which schemes that lets through.

Registration is open (RFC 7591), so a redirect URI is whatever a stranger
typed. The authorization server sends codes to these addresses, so each must
be one a real client of this kind could own:

* ``https`` with a host, for web clients;
* ``http`` only on this machine's loopback (``127.0.0.1``, ``[::1]``,
  ``localhost``), for native clients that listen on a local port (RFC 8252
  section 7.3);
* a private-use scheme such as ``cursor://`` or ``com.example.app:/cb``, for
  native clients the operating system wakes by scheme (RFC 8252 section 7.1),
  except the schemes a browser runs or reads itself (``javascript:``,
  ``data:``, ``file:``, ...), which would turn a redirect into a script or a
  local read, and those the operating system hands to a program of its own
  (``ms-msdt:``, ``search-ms:``, ``smb:``, ``intent:``, ``steam:``, ...);
  a code editor's scheme only in the form it hands to one extension
  (``cursor://anysphere.cursor-retrieval/...``), never one the editor acts on
  itself (``vscode:/extension/...`` installs an extension).

No URI may carry a fragment (RFC 6749 section 3.1.2) or credentials.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

MAX_URIS = 10
MAX_LENGTH = 2000
LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}
# Schemes the browser handles itself, rather than handing to an application.
REFUSED_SCHEMES = {
    "about",
    "blob",
    "chrome",
    "data",
    "file",
    "filesystem",
    "ftp",
    "javascript",
    "jar",
    "mailto",
    "sms",
    "tel",
    "vbscript",
    "view-source",
    "ws",
    "wss",
}
# Schemes the operating system hands to one of its own programs, which acts
# on the URI's words: a redirect there would run that program with what a
# stranger registered (a file share, a shell folder, a troubleshooter, an
# installer, an Android intent, a browser's or a game store's own commands),
# not wake a client waiting for its code.
SYSTEM_SCHEMES = {
    # Windows and its programs (the ms- ones are a prefix, below).
    "hcp",
    "help",
    "its",
    "microsoft-edge",
    "microsoft-edge-holographic",
    "mk",
    "mhtml",
    "read",
    "res",
    "search",
    "search-ms",
    "shell",
    "windowsdefender",
    "wsl",
    # macOS and iOS.
    "applescript",
    "facetime",
    "facetime-audio",
    "itms",
    "itms-apps",
    "itms-appss",
    "itms-services",
    "macappstore",
    "macappstores",
    "x-apple.systempreferences",
    "x-apple-helpbasic",
    "x-man-page",
    # Android.
    "android-app",
    "content",
    "intent",
    "market",
    # Browsers' own pages, extensions and internals.
    "chrome-extension",
    "chrome-search",
    "chrome-untrusted",
    "devtools",
    "edge",
    "moz-extension",
    "opera",
    "resource",
    "safari-extension",
    "safari-web-extension",
    "vivaldi",
    "brave",
    # Network clients and file shares: a redirect opens a connection or a share.
    "afp",
    "callto",
    "ftps",
    "git",
    "gopher",
    "irc",
    "ircs",
    "ldap",
    "ldaps",
    "news",
    "nfs",
    "nntp",
    "rdp",
    "sftp",
    "sip",
    "sips",
    "skype",
    "smb",
    "snews",
    "ssh",
    "svn",
    "svn+ssh",
    "telnet",
    "vnc",
    "webcal",
    "xmpp",
    # Installers and launchers that act on the URI: Java Web Start, game stores,
    # desktop package managers, meeting apps.
    "appstream",
    "apt",
    "jnlp",
    "jnlps",
    "steam",
    "snap",
    "zoommtg",
    "zoomus",
}
# Windows gives its own programs' schemes this prefix (ms-settings, ms-msdt,
# ms-officecmd, ms-word, ...): no client of ours owns one.
SYSTEM_PREFIXES = ("ms-",)
# Code editors open files, clone repositories and install extensions from
# their scheme's URIs (vscode:/extension/..., vscode://file/...). Only the
# form they hand to one extension's own handler, ``scheme://publisher.name/...``,
# is a client waiting for its code (Cursor's cursor://anysphere.cursor-retrieval/...);
# the editor's built-in extensions (publisher ``vscode``) are the editor's own.
EDITOR_SCHEMES = {"code-oss", "cursor", "vscode", "vscode-insiders", "vscodium", "windsurf"}
EXTENSION = re.compile(r"^[a-z0-9][a-z0-9-]*\.[a-z0-9][a-z0-9-]*$")
EDITOR_PUBLISHERS = {"vscode", "ms-vscode", "ms-vscode-remote"}
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")
# Controls (C0 and C1), spaces, the characters a URI never holds unencoded,
# and anything not ASCII (a URI is ASCII, RFC 3986): a no-break or ideographic
# space passed for a character of the URI, and the toolkit, which keeps the
# list joined by spaces and splits it on any whitespace, read a second URI
# after it that no check had seen.
UNSAFE = re.compile(r"[\x00-\x20\x7f-\U0010ffff<>\"{}|\\^`]")


def problem(uri: object) -> str | None:
    """Return why ``uri`` cannot be a redirect URI, or None when it can."""
    if not isinstance(uri, str) or not uri:
        return "each redirect URI must be a non-empty string"
    shown = uri[:80] + ("…" if len(uri) > 80 else "")
    if len(uri) > MAX_LENGTH:
        return f"redirect URI {shown!r} is longer than {MAX_LENGTH} characters"
    if UNSAFE.search(uri):
        return (
            f"redirect URI {shown!r} holds spaces or characters a URI cannot"
            " (percent-encode anything not ASCII; a host, in its punycode form)"
        )
    if "#" in uri:
        return f"redirect URI {shown!r} has a fragment, which OAuth forbids"
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return f"redirect URI {shown!r} is not a URI"
    scheme = parts.scheme.lower()
    if not SCHEME.match(scheme):
        return f"redirect URI {shown!r} has no scheme"
    if "@" in parts.netloc:
        return f"redirect URI {shown!r} carries credentials"
    if scheme == "https":
        return None if parts.hostname else f"redirect URI {shown!r} names no host"
    if scheme == "http":
        if (parts.hostname or "").lower() in LOOPBACK_HOSTS:
            return None
        return (
            f"redirect URI {shown!r} uses http on another machine; use https, or http on "
            "127.0.0.1, [::1] or localhost"
        )
    return (
        _scheme_problem(scheme, shown)
        or _editor_problem(scheme, parts, shown)
        or _shape_problem(uri, parts, shown)
    )


def _shape_problem(uri: str, parts: SplitResult, shown: str) -> str | None:
    """What the toolkit refuses after us in its own words ("invalid URI"), said in ours."""
    if parts.netloc:
        return None
    if uri[len(parts.scheme) + 1 :].startswith("//"):
        return f"redirect URI {shown!r} has an empty host after //; write com.example.app:/callback"
    if not parts.path.startswith("/"):
        return (
            f"redirect URI {shown!r} has no path after its scheme; a private-use scheme's URI "
            "goes on with / (com.example.app:/callback)"
        )
    return None


def _scheme_problem(scheme: str, shown: str) -> str | None:
    """Return why a private-use ``scheme`` cannot carry a code, or None when it can."""
    if scheme in REFUSED_SCHEMES:
        return f"redirect URI {shown!r} uses the {scheme}: scheme, which no client can receive"
    if scheme in SYSTEM_SCHEMES or scheme.startswith(SYSTEM_PREFIXES):
        return (
            f"redirect URI {shown!r} uses the {scheme}: scheme, which the operating system "
            "hands to a program of its own, not to a client"
        )
    return None


def _editor_problem(scheme: str, parts: SplitResult, shown: str) -> str | None:
    """Return why an editor's URI is no extension's callback, or None when it is one."""
    if scheme not in EDITOR_SCHEMES:
        return None
    authority = parts.netloc.lower()
    if EXTENSION.match(authority) and authority.split(".")[0] not in EDITOR_PUBLISHERS:
        return None
    return (
        f"redirect URI {shown!r} is one the {scheme}: editor acts on itself (opening files, "
        f"installing extensions); an extension's callback is {scheme}://publisher.name/..."
    )


def private_schemes(uris: list[str]) -> list[str]:
    """Return the private-use schemes among ``uris`` that ``problem`` lets through."""
    found = []
    for uri in uris:
        scheme = urlsplit(uri).scheme.lower()
        if scheme not in ("http", "https") and problem(uri) is None and scheme not in found:
            found.append(scheme)
    return found

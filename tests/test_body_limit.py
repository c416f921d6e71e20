"""A request to a Django page cannot make the server store more than its cap (recall/bodylimit.py).

Against a real server over a real socket: Django's handler would read a
whole body to a temporary file before any view could refuse it.
"""

from __future__ import annotations

import http.cookiejar
import json
import socket
import urllib.parse
import urllib.request

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from recall import bodylimit
from recall.bodylimit import MARGIN
from recall.error_responses import in_words
from tests.support import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHUNK = 64 * 1024
PASSWORD = "a-body-limit-password-1"
# Far past every cap (Django's 2.5 MiB and the margin): what a hostile client streams.
ENDLESS = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        live = LiveServer().start()
    yield live
    live.stop()


def answer_of(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    got = b""
    while b"\r\n\r\n" not in got:
        part = sock.recv(65536)
        if not part:
            break
        got += part
    head, _, body = got.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.lower().split(b"\r\n")
            if line.startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        part = sock.recv(65536)
        if not part:
            break
        body += part
    return head + b"\r\n\r\n" + body


def stream(
    port: int, path: str, accept: str = "application/json", headers: str = ""
) -> tuple[bytes, int]:
    """POST chunks with no length until the server answers; return its answer and the bytes sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\n{headers}"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        )
        sent = 0
        chunk = f"{CHUNK:x}\r\n".encode() + b"x" * CHUNK + b"\r\n"
        sock.settimeout(0.001)
        while sent < ENDLESS:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            except TimeoutError:
                pass  # the server stopped reading: its answer is waiting
            sent += CHUNK
            try:
                peek = sock.recv(1, socket.MSG_PEEK)
            except (TimeoutError, BlockingIOError):
                continue
            if peek:
                break
        return answer_of(sock), sent


def test_a_body_streamed_past_the_cap_is_cut_off_with_413(server):
    answer, sent = stream(server.port, "/webhooks/mcpize/subscription")

    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(body) == {
        "error": {"code": "validation_failed", "message": "Request body too large."}
    }
    # It stopped reading near the cap, not at the client's end (socket
    # buffers hold a few MiB more).
    assert sent < 2_621_440 + MARGIN + 16 * 1024 * 1024
    assert sent < ENDLESS


@pytest.mark.parametrize("path", ["/login/", "/static/recall.css"])
def test_a_declared_length_over_the_cap_is_refused_before_a_byte_is_read(server, path):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\n".encode() + b"Host: 127.0.0.1\r\nAccept: text/html\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: 1073741824\r\n\r\n"
        )
        answer = answer_of(sock)

    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert b"text/plain" in head
    assert body == b"Request body too large."


@pytest.mark.parametrize("path", ["/oauth/token/", "/oauth/register/"])
def test_an_oauth_endpoint_refuses_a_body_too_large_in_oauths_own_json(server, path):
    # A browser-like Accept got the dashboard's plain text: an OAuth client
    # reads {"error": ...} from these endpoints (RFC 6749 5.2, RFC 7591 3.2.2).
    answer, _ = stream(server.port, path, accept="text/html,*/*")

    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert b"application/json" in head
    assert json.loads(body) == {
        "error": "invalid_request",
        "error_description": "Request body too large.",
    }


def signed_in(server: LiveServer) -> tuple[str, str]:
    """Sign Alice in through the login page: her cookie header and a CSRF token."""
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

    def cookie(name: str) -> str:
        return next(c.value for c in jar if c.name == name and c.value is not None)

    browser.open(server.url + "/login/").read()
    form = urllib.parse.urlencode(
        {
            "username": "alice@example.com",
            "password": PASSWORD,
            "csrfmiddlewaretoken": cookie("csrftoken"),
        }
    ).encode()
    page = browser.open(server.url + "/login/", data=form)
    assert page.url.rstrip("/").endswith("/memories") or "login" not in page.url, page.url
    browser.open(server.url + "/memories/").read()
    cookies = "; ".join(f"{c.name}={c.value}" for c in jar)
    return cookies, cookie("csrftoken")


def test_the_upload_page_words_its_own_refusal_of_a_declared_length(server, cast):
    # The tests' own hasher (MD5, for speed) is not among the server's.
    cast.alice.password = PBKDF2PasswordHasher().encode(PASSWORD, "bodylimittestsalt")
    cast.alice.save(update_fields=["password"])
    cookies, token = signed_in(server)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            b"POST /memories/import/ HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/html\r\n"
            b"Content-Type: multipart/form-data; boundary=x\r\n"
            + f"Cookie: {cookies}\r\nX-CSRFToken: {token}\r\n".encode()
            + f"Referer: {server.url}/memories/\r\n".encode()
            + b"Content-Length: 1073741824000\r\n\r\n"
        )
        answer = answer_of(sock)

    # Post/Redirect/Get: back to the memories page, which words the refusal.
    head = answer.partition(b"\r\n\r\n")[0]
    assert head.startswith(b"HTTP/1.1 302"), answer[:300]
    assert b"\r\nlocation: /memories/#imports" in head.lower()
    shown = urllib.request.urlopen(  # noqa: S310 (the test's own server, over http)
        urllib.request.Request(server.url + "/memories/", headers={"Cookie": cookies}),  # noqa: S310
        timeout=30,
    ).read()
    assert b"larger than the" in shown and b"recall import --from" in shown


def test_a_request_under_the_cap_is_served_as_before(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        body = b'{"event": "nothing"}'
        sock.sendall(
            b"POST /webhooks/mcpize/subscription HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        answer = answer_of(sock)

    # The webhook's own refusal of an unsigned event, not the cap's.
    assert not answer.startswith(b"HTTP/1.1 413"), answer[:200]


@pytest.mark.parametrize(
    ("accept", "path", "words"),
    [
        (None, "/login/", True),  # no Accept: Django reads */*, as error_responses does
        (b"*/*", "/login/", True),
        (b"text/html,application/xhtml+xml", "/login/", True),
        (b"application/json", "/login/", False),
        (b"text/html;q=0", "/login/", False),
        (b"text/html", "/api/keys/", False),  # a program's path: JSON whatever it accepts
        (b"text/html", "/webhooks/stripe/", False),
    ],
)
def test_the_413_is_worded_as_every_other_error_on_that_path(accept, path, words):
    headers = [(b"accept", accept)] if accept is not None else []
    # As error_responses decides from request.accepts("text/html").
    assert in_words(path, bodylimit._accepts_html({"headers": headers})) is words


@pytest.mark.parametrize(
    "path",
    ["/static/../../etc/passwd", "/static/..%2f..%2fetc%2fpasswd", "/static/%2e%2e/settings.py"],
)
def test_a_static_path_that_climbs_out_is_not_found_not_a_server_error(server, path):
    # Django's static handler let SuspiciousFileOperation out: a 500 and an
    # error-level log line, which anyone could send without signing in.
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        answer = answer_of(sock)

    assert answer.startswith(b"HTTP/1.1 404"), answer[:200]
    assert "SuspiciousFileOperation" not in server.logs()

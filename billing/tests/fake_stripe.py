"""A local stand-in for the Stripe API calls Recall makes, on a real socket.

``FakeStripe`` answers ``POST /v1/customers``, ``POST /v1/checkout/sessions``
and ``POST /v1/billing_portal/sessions`` the way Stripe does (form-encoded in,
JSON out) and records every request, so tests can check what was sent.
Point ``STRIPE_API_BASE`` at ``fake.url``.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    form: dict[str, str]


@dataclass
class FakeStripe:
    requests: list[Recorded] = field(default_factory=list)
    # Set to an HTTP status to make every call fail with it.
    fail_with: int | None = None
    # Customers made, by idempotency key.
    customers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        fake = self
        ids = itertools.count(1)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode()
                fake.requests.append(
                    Recorded("POST", self.path, dict(self.headers), dict(parse_qsl(body)))
                )
                if fake.fail_with:
                    error = {"type": "api_error", "message": "The fake is failing on purpose."}
                    self._send(fake.fail_with, {"error": error})
                elif self.path == "/v1/checkout/sessions":
                    n = next(ids)
                    self._send(
                        200,
                        {
                            "id": f"cs_test_{n}",
                            "object": "checkout.session",
                            "url": f"https://checkout.stripe.test/c/pay/cs_test_{n}",
                        },
                    )
                elif self.path == "/v1/customers":
                    # As Stripe: a key seen before answers with what it made then.
                    key = self.headers.get("Idempotency-Key") or f"none-{next(ids)}"
                    made = fake.customers.setdefault(key, f"cus_fake_{len(fake.customers) + 1}")
                    self._send(200, {"id": made, "object": "customer"})
                elif self.path == "/v1/billing_portal/sessions":
                    n = next(ids)
                    self._send(
                        200,
                        {
                            "id": f"bps_{n}",
                            "object": "billing_portal.session",
                            "url": f"https://billing.stripe.test/p/session/bps_{n}",
                        },
                    )
                else:
                    error = {"type": "invalid_request_error", "message": "Unrecognized URL"}
                    self._send(404, {"error": error})

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Request-Id", "req_fake")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass  # keep test output clean

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's address
        return f"http://{host}:{port}"

    def start(self) -> FakeStripe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

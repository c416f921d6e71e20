"""Small real servers the OAuth tests need, on loopback ports.

* ``MetadataHost`` serves a client's metadata document over https, with a
  throwaway certificate authority made here (``ca_file`` is what a process
  must trust, through ``SSL_CERT_FILE``). It answers whatever ``routes``
  says, so a test can also make it redirect, stall or send too much.
* ``Callback`` is a client's redirect URI: it records the query string the
  browser brings back.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

Reply = tuple[int, dict[str, str], bytes]


def _certificate_authority(directory: Path) -> tuple[Path, Path, Path]:
    """Write a CA and a localhost/127.0.0.1 certificate it signed; return (ca, cert, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Recall test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (
        directory / "ca.pem",
        directory / "cert.pem",
        directory / "key.pem",
    )
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class MetadataHost:
    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="recall-cimd-"))
        self.ca_file, cert, key = _certificate_authority(self.directory)
        self.routes: dict[str, Callable[[], Reply]] = {}
        self.hits: list[str] = []
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                host.hits.append(self.path)
                route = host.routes.get(urlsplit(self.path).path)
                status, headers, body = route() if route else (404, {}, b"not here")
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str, host: str = "localhost") -> str:
        return f"https://{host}:{self.port}{path}"

    def serve_document(self, path: str, document: dict[str, Any], **headers: str) -> str:
        """Serve ``document`` as JSON at ``path``; return its URL."""
        body = json.dumps(document).encode()
        self.routes[path] = lambda: (200, {"Content-Type": "application/json", **headers}, body)
        return self.url(path)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.directory, ignore_errors=True)


class Callback:
    def __init__(self) -> None:
        self.received: list[dict[str, str]] = []
        self.arrived = threading.Event()
        callback = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                if parts.path == "/callback":  # not the browser's favicon request
                    callback.received.append({k: v[0] for k, v in parse_qs(parts.query).items()})
                    callback.arrived.set()
                body = b"<html><body><h1>You can close this window.</h1></body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/callback"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait(self, timeout: float = 30.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while not self.received and time.monotonic() < deadline:
            self.arrived.wait(0.1)
        if not self.received:
            raise TimeoutError("the browser never came back to the redirect URI")
        self.arrived.clear()
        return self.received.pop(0)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

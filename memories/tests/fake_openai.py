"""A local stand-in for an OpenAI-compatible embeddings server, on a real socket.

``FakeOpenAI`` answers ``POST /v1/embeddings`` in OpenAI's wire format (float
lists or base64, shuffled ``index`` order, usage) and records every request;
``script`` queues other replies (errors, delays, ``Retry-After``). Point
``OPENAI_BASE_URL`` at ``url``. Vectors are deterministic per text and
unrelated between texts, as a real model's are for unrelated texts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import numpy as np


def fake_vector(text: str, width: int) -> np.ndarray:
    """Deterministic, deliberately not normalised, different for each text."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return (np.random.default_rng(seed).standard_normal(width) * 3.0).astype(np.float32)


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # None: answer with embeddings
    delay: float = 0.0
    # Send the body this many seconds per 64 bytes: each read is quick, the whole slow.
    trickle: float = 0.0


@dataclass
class FakeOpenAI:
    url: str = ""
    width: int = 1536
    # Answer with float lists even when asked for base64, as Ollama does.
    always_float: bool = False
    # Drop the last vector from every answer.
    short_by_one: bool = False
    # Multiply every vector: a length float32 cannot hold is still a direction.
    scale: float = 1.0
    script: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        texts = body["input"]
        data = []
        for index, text in enumerate(texts):
            vector = fake_vector(text, self.width) * self.scale
            if body.get("encoding_format") == "base64" and not self.always_float:
                encoded: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode()
            else:
                encoded = vector.tolist()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        if self.short_by_one:
            data.pop()
        # OpenAI does not promise order; the index field is what counts.
        data.reverse()
        tokens = sum(len(text.split()) for text in texts)
        return {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


@contextmanager
def serving() -> Iterator[FakeOpenAI]:
    """Serve a FakeOpenAI on a free loopback port for the block."""
    state = FakeOpenAI()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                state.requests.append(
                    {
                        "path": self.path,
                        "body": body,
                        "authorization": self.headers.get("Authorization"),
                        "at": time.monotonic(),
                    }
                )
                reply = state.script.pop(0) if state.script else Reply()
            time.sleep(reply.delay)
            # As a proxy, a request names its whole URL (absolute form).
            if urlsplit(self.path).path != "/v1/embeddings":
                reply = Reply(404, body={"error": {"message": "no such route"}})
            payload = json.dumps(reply.body if reply.body is not None else state.answer(body))
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                data = payload.encode()
                if not reply.trickle:
                    self.wfile.write(data)
                for start in range(0, len(data) if reply.trickle else 0, 64):
                    self.wfile.write(data[start : start + 64])
                    self.wfile.flush()
                    time.sleep(reply.trickle)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out and left

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()

"""Write load for fault tests: threads calling ``remember`` with unique content until stopped.

Each call's outcome is kept, so a test can check afterwards that every
acknowledged write is stored, that no refused write is, and that clients saw
nothing but success and the refusals an outage allows.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace

import httpx2

HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-11-25",
}


@dataclass(frozen=True)
class Outcome:
    content: str
    # "ok", or what the client saw instead: "http 503", "unavailable", "transport", ...
    kind: str
    memory_id: str | None = None
    # How long the call took to be answered, in seconds, and when it was
    # answered (time.monotonic()).
    seconds: float = 0.0
    answered: float = 0.0


class WriteLoad:
    def __init__(self, mcp_url: str, key: str, *, threads: int = 4, tag: str = "w") -> None:
        self.mcp_url = mcp_url
        self.key = key
        self.threads = threads
        self.tag = tag
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def __enter__(self) -> WriteLoad:
        for n in range(self.threads):
            worker = threading.Thread(target=self._run, args=(n,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(120)

    def _run(self, worker: int) -> None:
        headers = {**HEADERS, "Authorization": f"Bearer {self.key}"}
        with httpx2.Client(headers=headers, timeout=60) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                content = f"{self.tag} fault-load memory {worker}-{n}"
                began = time.monotonic()
                outcome = self._remember(client, content)
                now = time.monotonic()
                outcome = replace(outcome, seconds=now - began, answered=now)
                with self._lock:
                    self.outcomes.append(outcome)
                if outcome.kind != "ok":
                    time.sleep(0.05)  # as a client backing off would

    def _remember(self, client: httpx2.Client, content: str) -> Outcome:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "remember", "arguments": {"content": content}},
        }
        try:
            response = client.post(self.mcp_url, content=json.dumps(body))
        except httpx2.TransportError:
            return Outcome(content, "transport")
        if response.status_code != 200:
            return Outcome(content, f"http {response.status_code}")
        result = response.json().get("result") or {}
        structured = result.get("structuredContent") or {}
        if result.get("isError"):
            return Outcome(content, str((structured.get("error") or {}).get("code")))
        return Outcome(content, "ok", structured.get("id"))

    def kinds(self) -> Counter[str]:
        with self._lock:
            return Counter(outcome.kind for outcome in self.outcomes)

    def acknowledged(self) -> dict[str, str]:
        """Content -> id of every write the server acknowledged."""
        with self._lock:
            return {o.content: o.memory_id for o in self.outcomes if o.kind == "ok" and o.memory_id}

    def refused(self) -> set[str]:
        with self._lock:
            return {o.content for o in self.outcomes if o.kind != "ok"}

    def wait_for(self, count: int, timeout: float = 60) -> None:
        """Block until ``count`` more calls have been answered."""
        target = len(self.outcomes) + count
        deadline = time.monotonic() + timeout
        while len(self.outcomes) < target:
            assert time.monotonic() < deadline, f"load stalled at {len(self.outcomes)} calls"
            time.sleep(0.05)

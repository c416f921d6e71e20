"""Calls to the self-service key API, the way a client sends them."""

from __future__ import annotations

import json
from typing import Any

from django.test import Client


def call(client: Client, method: str, path: str, raw_key: str | None, body: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {raw_key}"} if raw_key else {}
    data = json.dumps(body) if body is not None and not isinstance(body, str) else body
    return client.generic(
        method, path, data or "", content_type="application/json", headers=headers
    )

"""What /mcp says it can do: tools, and nothing it does not serve.

A client believes the capabilities a server advertises. Advertised prompts
and resources that do not exist send it to methods that can only fail.
"""

from __future__ import annotations

import anyio
import httpx2
import pytest

from tests.clients import session
from tests.fuzz import GENERATIONS, envelope, headers

pytestmark = pytest.mark.slow

HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-11-25",
}
METHOD_NOT_FOUND = -32601


def rpc(live, key: str, method: str, params: dict | None = None) -> httpx2.Response:
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params or {}}
    return httpx2.post(
        live.mcp_url, headers={**HEADERS, "Authorization": f"Bearer {key}"}, json=body, timeout=30
    )


# "legacy" reads the initialize result; "auto" probes server/discover, the
# 2026-07-28 way of asking.
@pytest.mark.parametrize(("mode", "version"), [("legacy", "2025-11-25"), ("auto", "2026-07-28")])
def test_the_server_advertises_tools_and_nothing_it_does_not_serve(live, cast, mode, version):
    async def capabilities():
        async with session(live.mcp_url, cast.alice_key.raw, mode) as client:
            return client.protocol_version, client.server_capabilities

    negotiated, advertised = anyio.run(capabilities)

    assert negotiated == version

    assert advertised.tools is not None
    assert advertised.prompts is None
    assert advertised.resources is None


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("prompts/get", {"name": "no-such-prompt"}),
        ("prompts/list", {}),
        ("resources/read", {"uri": "recall://no-such-resource"}),
        ("resources/list", {}),
        ("resources/templates/list", {}),
    ],
)
def test_prompt_and_resource_methods_are_not_found_never_an_internal_error(
    live, cast, method, params
):
    response = rpc(live, cast.alice_key.raw, method, params)

    assert response.status_code == 200
    error = response.json()["error"]
    assert error["code"] == METHOD_NOT_FOUND
    assert "request failed" not in live.logs()  # nothing logged as a server failure


@pytest.mark.parametrize("method", ["foo/bar", "resources/list", "prompts/list"])
def test_a_method_the_server_lacks_is_the_callers_mistake_in_either_generation(live, cast, method):
    # In 2026-07-28 the SDK answers it with HTTP 404, which was read as a
    # missing memory or job: "not_found".
    for generation in GENERATIONS:
        body = envelope(method, {}, generation)
        response = httpx2.post(
            live.mcp_url, headers=headers(cast.alice_key.raw, generation, body), json=body
        )

        error = response.json()["error"]
        assert error["code"] == METHOD_NOT_FOUND, generation
        assert error["data"]["error"]["code"] == "validation_failed", generation

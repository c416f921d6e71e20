"""`recall serve` that cannot listen gives the advice that fits why: a busy port, or a bad HOST."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from recall.cli import _cannot_listen, _port_taken


@pytest.fixture
def held() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_busy_port_says_to_stop_what_holds_it(held, workers):
    said = _cannot_listen("127.0.0.1", held, _port_taken("127.0.0.1", held, workers) or "")

    assert said.endswith("Stop what holds it, or set HOST and PORT.")


@pytest.mark.parametrize("host", ["not a host", "192.0.2.1"])  # no name; TEST-NET-1, not here
@pytest.mark.parametrize("workers", [1, 2])
def test_a_host_that_is_not_this_machines_says_so(host, workers):
    reason = _port_taken(host, 8599, workers)
    assert reason

    said = _cannot_listen(host, 8599, reason)

    assert "HOST is not an address of this machine" in said
    assert "Stop what holds it" not in said

"""`recall serve` checks its port as uvicorn will bind it, before it makes anything."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from recall.cli import _port_taken


@pytest.fixture
def held() -> Iterator[int]:
    """A port another server listens on, on every IPv4 address."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))  # noqa: S104 - a test's own listener
        holder.listen()
        yield holder.getsockname()[1]


def has_ipv6() -> bool:
    """Whether this machine (not only Python) can bind an IPv6 socket."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])  # noqa: S104
def test_a_port_held_on_ipv4_is_taken_for_every_ipv4_host(held, host, workers):
    assert _port_taken(host, held, workers) == "in use: another server may be running there"


def test_localhost_with_several_workers_is_its_ipv4_address(held):
    assert _port_taken("localhost", held, 2) == "in use: another server may be running there"


@pytest.mark.parametrize("host", ["a..b", "bad\x00host"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_host_no_socket_takes_is_a_reason_not_a_traceback(host, workers):
    assert _port_taken(host, 8080, workers)


def test_on_the_ipv6_wildcard_several_workers_bind_both_families_one_binds_v6_only(held):
    # uvicorn's one socket for several workers is dual-stack (Linux's
    # default), so the IPv4 listener is in its way; asyncio's sockets for
    # one worker are v6-only.
    if not has_ipv6():
        pytest.skip("no IPv6 here")
    assert _port_taken("::", held, 2) == "in use: another server may be running there"
    assert _port_taken("::", held, 1) is None


def test_a_free_port_is_free(held):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert _port_taken("127.0.0.1", free, 1) is None
    assert _port_taken("127.0.0.1", free, 2) is None

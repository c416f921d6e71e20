"""The shared cast, the same in every test.

* Alice owns things. ``alice_key`` is her first API key.
* Bob holds a second key of Alice's (``bob_key``): same tenant, other key.
* Charlie is another tenant and must never see Alice's data.

``agents`` adds Alice's two agents, ``research`` and ``writer``, and
Charlie's ``helper``: an agent sees only its own memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from accounts import auth
from accounts.models import Agent, ApiKey, User
from core import tenancy
from memories.embeddings.failures import outcomes


@dataclass
class Key:
    key: ApiKey
    raw: str


@dataclass
class Cast:
    alice: User
    alice_key: Key
    bob_key: Key
    charlie: User
    charlie_key: Key


def issue_key(user: User, name: str, tier: str | None = None) -> Key:
    with tenancy.operator():
        key, raw = ApiKey.objects.issue(user=user, name=name, tier=tier)
    return Key(key, raw)


@pytest.fixture(autouse=True)
def fresh_auth_cache() -> Iterator[None]:
    """Start and end every test with an empty auth cache and no Redis client.

    Without it a key cached by one test would still authenticate in the next,
    after its row is gone, and a Redis client would outlive its server.
    """
    auth.reset()
    yield
    auth.reset()


@pytest.fixture(autouse=True)
def embedder_not_failing() -> None:
    """Start every test with no failed embedding call on record (health_check reads it)."""
    outcomes.succeeded()


@dataclass
class Agents:
    research: Agent
    writer: Agent
    helper: Agent  # Charlie's


@pytest.fixture
def cast(db) -> Cast:
    alice = User.objects.create_user("alice@example.com", "alice-password-1")
    charlie = User.objects.create_user("charlie@example.com", "charlie-password-1")
    return Cast(
        alice=alice,
        alice_key=issue_key(alice, "alice laptop"),
        bob_key=issue_key(alice, "bob's agent"),
        charlie=charlie,
        charlie_key=issue_key(charlie, "charlie laptop"),
    )


@pytest.fixture
def agents(cast: Cast) -> Agents:
    with tenancy.operator():
        return Agents(
            research=Agent.objects.create(user=cast.alice, name="research"),
            writer=Agent.objects.create(user=cast.alice, name="writer"),
            helper=Agent.objects.create(user=cast.charlie, name="helper"),
        )


FUZZ_CI_CASES = 100  # per fuzz test; 11 tests, a few minutes in CI


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-cases",
        type=int,
        default=FUZZ_CI_CASES,
        help=f"Cases per fuzz test (tests/test_fuzz_*.py); CI runs {FUZZ_CI_CASES}.",
    )


@pytest.fixture
def fuzz_settings(request: pytest.FixtureRequest):
    """Hypothesis settings for a fuzz test: ``--fuzz-cases`` examples, no deadline.

    The fixtures a fuzz test uses (a live server, the cast) hold for all its
    examples, which is what is wanted: state builds up as it would in use.
    """
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=request.config.getoption("--fuzz-cases"),
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    from tests import fuzz

    if fuzz.CASES:
        total = sum(fuzz.CASES.values())
        terminalreporter.write_line(f"fuzz: {total} cases over HTTP")
        for name, count in sorted(fuzz.CASES.items()):
            terminalreporter.write_line(f"  {name}: {count}")
        terminalreporter.write_line("fuzz outcomes:")
        for outcome, count in sorted(fuzz.OUTCOMES.items()):
            terminalreporter.write_line(f"  {outcome}: {count}")


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    # Password hashing is deliberately slow; tests need it correct, not slow.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """With RECALL_NO_SKIPS=1 (CI), a skipped test fails: a missing server is a broken build."""
    outcome = yield
    report = outcome.get_result()
    strict = os.environ.get("RECALL_NO_SKIPS") == "1"
    if strict and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, but RECALL_NO_SKIPS=1: {report.longrepr}"

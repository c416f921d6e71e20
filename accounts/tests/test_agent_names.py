"""An agent's name comes from a person or a client; PostgreSQL must be able to store it."""

from __future__ import annotations

import pytest

from accounts import services
from accounts.models import Agent, ApiKey
from core import tenancy
from core.errors import ValidationFailed
from tests.support import at_once


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("research\x00", "An agent's name must not contain NUL characters."),
        ("research\ud800", "An agent's name must be valid Unicode text."),
        ("r" * 65, "An agent's name is at most 64 characters."),
        ("   ", "An agent needs a name, such as 'research' or 'claude-desktop'."),
        # A direction override reversed the words after the name on the page
        # that showed it ("Agent research.detaerc").
        ("research\u202e", "An agent's name must not hold control or text-direction characters."),
        ("\u2067research", "An agent's name must not hold control or text-direction characters."),
        ("re\x1bsearch", "An agent's name must not hold control or text-direction characters."),
        ("re\x9bsearch", "An agent's name must not hold control or text-direction characters."),
    ],
)
def test_a_name_that_cannot_be_stored_is_refused(cast, name, message):
    with pytest.raises(ValidationFailed) as refused:
        services.create_agent(user_id=cast.alice.id, name=name)

    assert refused.value.message == message
    with tenancy.operator():
        assert not Agent.objects.filter(user=cast.alice).exists()


def test_emoji_and_right_to_left_names_are_names(cast):
    # A joiner holds an emoji together; Hebrew needs no direction character.
    for name in ("\U0001f469\u200d\U0001f4bb coder", "\u05e9\u05dc\u05d5\u05dd", "\u200fnoor"):
        assert services.create_agent(user_id=cast.alice.id, name=name).name == name


def test_renaming_applies_the_same_rule(cast):
    agent = services.create_agent(user_id=cast.alice.id, name="research")

    with pytest.raises(ValidationFailed):
        services.rename_agent(user_id=cast.alice.id, agent_id=agent.id, name="re\x00search")

    assert services.get_agent(user_id=cast.alice.id, agent_id=agent.id).name == "research"


def test_the_dashboard_shows_the_refusal_instead_of_failing(cast, client):
    client.force_login(cast.alice)

    response = client.post("/agents/", {"name": "bad\x00name"})

    assert response.status_code == 200
    assert "must not contain NUL characters" in response.content.decode()
    with tenancy.operator():
        assert not Agent.objects.filter(user=cast.alice).exists()


@pytest.mark.parametrize("name", ["esc\x1b[31mRED\x1b[0m", "evil\u202etxt.exe", "a\x9bb"])
def test_a_key_name_follows_the_same_rule(cast, name):
    # Accepted, an escape sequence reached the operator's terminal through
    # list-keys, and an override turned the name around on the Keys page.
    with pytest.raises(ValidationFailed, match="name must not hold control or text-direction"):
        services.issue_own_key(user_id=cast.alice.id, max_tier="free", name=name)

    with tenancy.operator():
        assert not ApiKey.objects.filter(name=name.strip()).exists()


@pytest.mark.django_db(transaction=True)
def test_one_name_created_several_times_at_once_is_one_agent_and_the_rest_are_told(cast):
    # A double click on "Create agent": the name's constraint refused the
    # second insert, and the user got a 500.
    def create() -> str:
        try:
            services.create_agent(user_id=cast.alice.id, name="racer")
            return "created"
        except ValidationFailed as refused:
            return refused.message

    outcomes = at_once(6, create)

    assert sorted(outcomes) == ["You already have an agent called 'racer'."] * 5 + ["created"]


@pytest.mark.django_db(transaction=True)
def test_names_differing_only_in_case_created_at_once_are_one_agent(cast):
    # Names are looked up ignoring case, but the constraint compared them as
    # written: "Claude" and "claude" made at the same moment both succeeded.
    names = iter(["Claude", "claude", "CLAUDE", "cLaude"])

    def create() -> str:
        try:
            services.create_agent(user_id=cast.alice.id, name=next(names))
            return "created"
        except ValidationFailed:
            return "refused"

    outcomes = at_once(4, create)

    assert sorted(outcomes) == ["created"] + ["refused"] * 3
    with tenancy.tenant(cast.alice.id):
        assert Agent.objects.filter(user=cast.alice, name__iexact="claude").count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_agent_found_or_made_by_several_callers_at_once_is_the_same_one(cast):
    # A trusted client's two connections, or two imports naming one agent:
    # the caller that lost the race was refused instead of given the agent.
    names = iter(["Cursor", "cursor", "Cursor", "CURSOR", "cursor"])

    def find_or_make() -> tuple[str, bool]:
        agent, made = services.agent_called(user_id=cast.alice.id, name=next(names))
        return str(agent.id), made

    outcomes = at_once(5, find_or_make)

    assert len(outcomes) == 5
    assert len({agent_id for agent_id, _ in outcomes}) == 1
    assert sum(made for _, made in outcomes) == 1


def test_a_name_the_index_folds_like_another_is_found_by_it(cast):
    # The unique index folds with lower(), the lookups folded with UPPER():
    # "Kelvin" spelt with the Kelvin sign (U+212A) is "kelvin" to lower() and
    # not to UPPER(), so the index refused "kelvin" and no lookup found it.
    kelvin = services.create_agent(user_id=cast.alice.id, name="\u212aelvin")

    found, made = services.agent_called(user_id=cast.alice.id, name="kelvin")

    assert (found.id, made) == (kelvin.id, False)
    with pytest.raises(ValidationFailed, match="already have an agent called 'kelvin'"):
        services.create_agent(user_id=cast.alice.id, name="kelvin")

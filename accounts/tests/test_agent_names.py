"""An agent's name comes from a person or a client; PostgreSQL must be able to store it."""

from __future__ import annotations

import pytest

from accounts import services
from accounts.models import Agent
from core import tenancy
from core.errors import ValidationFailed


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("research\x00", "An agent's name must not contain NUL characters."),
        ("research\ud800", "An agent's name must be valid Unicode text."),
        ("r" * 65, "An agent's name is at most 64 characters."),
        ("   ", "An agent needs a name, such as 'research' or 'claude-desktop'."),
    ],
)
def test_a_name_that_cannot_be_stored_is_refused(cast, name, message):
    with pytest.raises(ValidationFailed) as refused:
        services.create_agent(user_id=cast.alice.id, name=name)

    assert refused.value.message == message
    with tenancy.operator():
        assert not Agent.objects.filter(user=cast.alice).exists()


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

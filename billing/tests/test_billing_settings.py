"""Billing settings fail at start-up, naming the variable, when they are wrong."""

from __future__ import annotations

import pytest

from tests import support as testing


def load_settings(**environment: str):
    return testing.load_settings(
        "from recall import settings; print(settings.STRIPE_PRICE_TO_TIER)", **environment
    )


@pytest.mark.parametrize(
    ("environment", "named"),
    [
        ({"STRIPE_PRICE_TO_TIER": "price_abc=pro"}, "STRIPE_PRICE_TO_TIER"),
        ({"STRIPE_PRICE_TO_TIER": '["price_abc"]'}, "STRIPE_PRICE_TO_TIER"),
        ({"STRIPE_PRICE_TO_TIER": '{"price_abc": "platinum"}'}, "STRIPE_PRICE_TO_TIER"),
        ({"STRIPE_PRICE_TO_TIER": '{"price_abc": 2}'}, "STRIPE_PRICE_TO_TIER"),
        ({"MAX_KEYS_PER_USER": "0"}, "MAX_KEYS_PER_USER"),
        ({"SIGNUP_ENABLED": "sometimes"}, "SIGNUP_ENABLED"),
        ({"MCPIZE_REQUIRE_TIMESTAMP": "perhaps"}, "MCPIZE_REQUIRE_TIMESTAMP"),
    ],
)
def test_a_bad_value_fails_at_start_up_naming_the_variable(environment, named):
    result = load_settings(**environment)

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert named in result.stderr.splitlines()[-1]


def test_a_price_map_is_read_as_json():
    result = load_settings(STRIPE_PRICE_TO_TIER='{"price_abc": "starter", "price_def": "team"}')

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "{'price_abc': 'starter', 'price_def': 'team'}"

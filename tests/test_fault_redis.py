"""Redis killed under load: servers keep serving on their own limiters, then share again."""

from __future__ import annotations

import pytest

from tests.load import WriteLoad
from tests.support import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_killing_redis_under_load_costs_no_request(cast, redis):
    env = {"REDIS_URL": redis.url, "RATE_LIMIT_FREE": "100000/min"}
    with LiveServer(env=env) as server:
        with WriteLoad(server.mcp_url, cast.alice_key.raw, tag="redis") as load:
            load.wait_for(20)
            redis.stop()  # SIGKILL
            load.wait_for(30)
            redis.start()
            load.wait_for(30)
        logs = server.logs()

    assert set(load.kinds()) == {"ok"}
    assert logs.count("Shared rate limiter unavailable") == 1
    assert '"level": "error"' not in logs
    # Redis's own error text names its address: the log says only what failed.
    assert f"127.0.0.1:{redis.port}" not in logs

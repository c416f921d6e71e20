"""A tool call's arguments are checked against the tool's model once, not once per layer.

The middleware checks them (to answer a bad call cleanly); the SDK, which
checks them again before calling the tool, is handed that outcome.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from accounts import auth
from billing import usage
from recall.tests.test_fastpath import LEGACY, Recorder, ask, request


@pytest.mark.django_db(transaction=True)
def test_a_tool_calls_arguments_are_validated_once(cast, settings, monkeypatch):
    settings.DATABASES["default"]["CONN_MAX_AGE"] = 0
    monkeypatch.setattr(usage, "_recorder", Recorder())
    checked: list[str] = []
    original = BaseModel.model_validate.__func__

    def counting(cls: type[BaseModel], obj: Any, *args: Any, **kwargs: Any) -> BaseModel:
        if cls.__name__ == "list_memoriesArguments":
            checked.append(cls.__name__)
        return original(cls, obj, *args, **kwargs)

    monkeypatch.setattr(BaseModel, "model_validate", classmethod(counting))
    caller = auth.AuthContext(user_id=cast.alice.id, api_key_id=cast.alice_key.key.id, tier="free")
    message = request("tools/call", {"name": "list_memories", "arguments": {"limit": 5}})

    taken, sent = ask(message, LEGACY, caller)

    assert taken
    assert json.loads(sent[1]["body"])["result"]["structuredContent"]["count"] == 0
    assert checked == ["list_memoriesArguments"]


@pytest.mark.django_db(transaction=True)
def test_a_bad_argument_is_still_refused_cleanly(cast, settings, monkeypatch):
    settings.DATABASES["default"]["CONN_MAX_AGE"] = 0
    monkeypatch.setattr(usage, "_recorder", Recorder())
    caller = auth.AuthContext(user_id=cast.alice.id, api_key_id=cast.alice_key.key.id, tier="free")
    message = request("tools/call", {"name": "list_memories", "arguments": {"limit": 500}})

    _, sent = ask(message, LEGACY, caller)

    error = json.loads(sent[1]["body"])["result"]["structuredContent"]["error"]
    assert error["code"] == "validation_failed"
    assert "limit" in error["message"] and "500" not in error["message"]

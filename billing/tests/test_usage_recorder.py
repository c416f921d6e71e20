"""The usage recorder: never blocks a call, writes through the tenant path, drops loudly."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest

from billing import usage
from billing.models import UsageEvent
from conftest import Cast
from recall import tenancy

pytestmark = pytest.mark.django_db(transaction=True)


def event(user_id, key_id=None, **overrides) -> usage.Event:
    fields = {
        "user_id": user_id,
        "api_key_id": key_id,
        "request_id": uuid.uuid4().hex,
        "tool_name": "recall",
        "success": True,
        "latency_ms": 7,
    }
    fields.update(overrides)
    return usage.Event(**fields)


def test_it_writes_each_users_events_and_flushes_on_stop(cast):
    recorder = usage.UsageRecorder()
    for _ in range(3):
        recorder.record(event(cast.alice.id, cast.alice_key.key.id))
    recorder.record(
        event(cast.charlie.id, cast.charlie_key.key.id, success=False, error_code="not_found")
    )
    recorder.stop()

    with tenancy.tenant(cast.alice.id):
        assert UsageEvent.objects.count() == 3
    with tenancy.tenant(cast.charlie.id):
        [charlies] = UsageEvent.objects.all()
    assert (charlies.success, charlies.error_code, charlies.latency_ms) == (False, "not_found", 7)


def test_a_full_queue_drops_the_event_with_a_warning_and_never_blocks(cast, caplog):
    recorder = usage.UsageRecorder(maxsize=2)
    gate = threading.Event()
    recorder._write = lambda batch: gate.wait(10)  # a stalled database
    recorder.record(event(cast.alice.id))  # taken by the writer, which then stalls
    threading.Event().wait(0.2)
    with caplog.at_level(logging.WARNING, logger="billing.usage"):
        for _ in range(5):
            recorder.record(event(cast.alice.id))
    gate.set()
    recorder.stop()

    assert recorder.dropped == 3
    assert caplog.text.count("usage event dropped: queue full") == 3


def test_a_failed_write_is_logged_and_the_recorder_carries_on(cast, caplog):
    recorder = usage.UsageRecorder()
    with caplog.at_level(logging.WARNING, logger="billing.usage"):
        recorder.record(event(uuid.uuid4()))  # no such user: the insert fails
        recorder.flush()
    recorder.record(event(cast.alice.id))
    recorder.stop()

    assert "usage events dropped: write failed" in caplog.text
    with tenancy.tenant(cast.alice.id):
        assert UsageEvent.objects.count() == 1


def test_last_used_at_is_written_in_one_batch(cast):
    from accounts.models import ApiKey

    recorder = usage.UsageRecorder()
    recorder.touch_key(cast.alice_key.key.id)
    recorder.touch_key(cast.bob_key.key.id)
    recorder.stop()

    with tenancy.operator():
        used = dict(ApiKey.objects.values_list("id", "last_used_at"))
    assert used[cast.alice_key.key.id] is not None
    assert used[cast.bob_key.key.id] is not None
    assert used[cast.charlie_key.key.id] is None


def test_events_that_arrive_together_are_written_in_one_transaction(
    cast: Cast, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = usage.UsageRecorder()
    written: list[int] = []
    writing, release = threading.Event(), threading.Event()
    write = recorder._write

    def held_write(batch: list[usage.Event]) -> None:
        written.append(len(batch))
        if len(written) == 1:
            # Hold the first write, so the next five arrive while it is in
            # flight, however the threads are scheduled.
            writing.set()
            release.wait(10)
        write(batch)

    monkeypatch.setattr(recorder, "_write", held_write)
    recorder.record(event(cast.alice.id))
    assert writing.wait(10)
    for _ in range(5):
        recorder.record(event(cast.alice.id))
    release.set()
    recorder.stop()

    assert written == [1, 5]
    with tenancy.tenant(cast.alice.id):
        assert UsageEvent.objects.count() == 6

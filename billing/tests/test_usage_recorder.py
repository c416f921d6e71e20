"""The usage recorder: never blocks a call, writes through the tenant path, drops loudly."""

from __future__ import annotations

import logging
import threading
import uuid

import psycopg
import pytest
from django import db

from billing import usage
from billing.models import UsageEvent
from conftest import Cast
from core import tenancy

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
    recorder._write = lambda batch: gate.wait(10) and []  # a stalled database
    recorder.record(event(cast.alice.id))  # taken by the writer, which then stalls
    threading.Event().wait(usage.LINGER + 0.2)  # the writer lingers, then takes it
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


def test_a_keys_first_call_is_written_at_once_and_then_once_per_interval(cast):
    from accounts.models import ApiKey

    def last_used():
        with tenancy.operator():
            return ApiKey.objects.get(id=cast.alice_key.key.id).last_used_at

    now = [1000.0]
    recorder = usage.UsageRecorder(clock=lambda: now[0])
    recorder.touch_key(cast.alice_key.key.id)
    recorder._write_last_used(force=False)  # the writer's next tick
    first = last_used()
    assert first is not None  # no 30-second wait: the Keys page must not say "never"

    recorder.touch_key(cast.alice_key.key.id)
    now[0] += usage.LAST_USED_INTERVAL - 1
    recorder._write_last_used(force=False)
    assert last_used() == first  # written at most once per interval

    now[0] += 1
    recorder._write_last_used(force=False)
    assert last_used() > first


def test_events_that_arrive_together_are_written_in_one_transaction(
    cast: Cast, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = usage.UsageRecorder()
    written: list[int] = []
    writing, release = threading.Event(), threading.Event()
    write = recorder._write

    def held_write(batch: list[usage.Event]) -> list[usage.Event]:
        written.append(len(batch))
        if len(written) == 1:
            # Hold the first write, so the next five arrive while it is in
            # flight, however the threads are scheduled.
            writing.set()
            release.wait(10)
        return write(batch)

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


class Outage:
    """Make the recorder's inserts fail as they do while the database is unreachable."""

    def __init__(self, monkeypatch) -> None:
        self.down = True
        self.attempts = 0
        original = UsageEvent.objects.bulk_create

        def bulk_create(objs, *args, **kwargs):
            self.attempts += 1
            if self.down:
                try:
                    raise psycopg.OperationalError("connection refused")
                except psycopg.OperationalError as cause:
                    raise db.OperationalError("connection refused") from cause
            return original(objs, *args, **kwargs)

        monkeypatch.setattr(UsageEvent.objects, "bulk_create", bulk_create)


def test_events_that_meet_an_outage_are_held_and_written_when_it_ends(cast, monkeypatch):
    monkeypatch.setattr(usage, "RETRY_MIN", 0.05)
    outage = Outage(monkeypatch)
    recorder = usage.UsageRecorder()
    recorder._retry_delay = 0.05
    for n in range(4):
        recorder.record(event(cast.alice.id, request_id=f"held-{n}"))

    assert recorder.flush(timeout=2) is False
    assert recorder.stats() == {"queued": 0, "held": 4, "dropped": 0}
    outage.down = False
    assert recorder.flush(timeout=5) is True
    recorder.stop()

    assert recorder.stats() == {"queued": 0, "held": 0, "dropped": 0}
    with tenancy.tenant(cast.alice.id):
        stored = list(UsageEvent.objects.order_by("id").values_list("request_id", flat=True))
    assert stored == [f"held-{n}" for n in range(4)]


def test_when_the_outage_buffer_is_full_further_events_are_counted_as_dropped(
    cast, monkeypatch, caplog
):
    Outage(monkeypatch)
    recorder = usage.UsageRecorder(held_max=3)
    with caplog.at_level(logging.ERROR, logger="billing.usage"):
        for _ in range(5):
            recorder.record(event(cast.alice.id))
        recorder.flush(timeout=2)
        recorder.stop(timeout=1)

    # Three held until shutdown, then lost with them; two never fit.
    assert recorder.dropped == 5
    assert "the outage buffer is full" in caplog.text
    assert "usage events lost at shutdown" in caplog.text


def test_an_event_written_twice_is_stored_once(cast):
    recorder = usage.UsageRecorder()
    once = event(cast.alice.id)
    assert recorder._write([once]) == []
    assert recorder._write([once]) == []  # as a retry after an unanswered COMMIT would

    with tenancy.tenant(cast.alice.id):
        assert UsageEvent.objects.filter(event_id=once.event_id).count() == 1


def test_an_event_the_database_refuses_costs_only_itself_not_its_batch(cast, caplog):
    # A NUL in an event's text fails its insert; it used to take every event
    # of its user written in the same batch with it.
    recorder = usage.UsageRecorder()
    good = [event(cast.alice.id, cast.alice_key.key.id) for _ in range(4)]
    bad = event(cast.alice.id, cast.alice_key.key.id, tool_name="ab\x00cd")
    with caplog.at_level(logging.WARNING, logger="billing.usage"):
        kept = recorder._write([good[0], good[1], bad, good[2], good[3]])
    recorder.stop()

    assert kept == []
    assert recorder.dropped == 1
    assert caplog.text.count("usage events dropped: write failed") == 1
    with tenancy.tenant(cast.alice.id):
        stored = set(UsageEvent.objects.values_list("request_id", flat=True))
    assert stored == {e.request_id for e in good}


@pytest.mark.parametrize("name", ["remember\x00", "\udfff", "x\ud800y"])
def test_a_call_of_a_tool_named_with_what_postgresql_cannot_store_leaves_one_event(cast, name):
    from accounts.callers import AuthContext
    from core import usage as core_usage

    caller = AuthContext(user_id=cast.alice.id, api_key_id=cast.alice_key.key.id, tier="free")
    made = core_usage.event_of(
        caller, name, request_id=uuid.uuid4().hex, error_code="not_found", latency_ms=1
    )
    recorder = usage.UsageRecorder()
    recorder.record(made)
    recorder.stop()

    assert recorder.dropped == 0
    with tenancy.tenant(cast.alice.id):
        [stored] = UsageEvent.objects.all()
    assert stored.tool_name == name.replace("\x00", "\ufffd").replace("\udfff", "\ufffd").replace(
        "\ud800", "\ufffd"
    )


def test_a_batch_refused_for_a_cause_all_its_events_share_is_not_tried_event_by_event(
    cast, caplog, monkeypatch
):
    # Its user gone: each event alone was tried and logged, 500 round trips
    # and 500 tracebacks on the one writer thread.
    from billing import services

    recorder = usage.UsageRecorder()
    tries: list[int] = []
    real = services.save_usage_events

    def counted(**kwargs):
        tries.append(len(kwargs["events"]))
        return real(**kwargs)

    monkeypatch.setattr(services, "save_usage_events", counted)
    gone = uuid.uuid4()
    with caplog.at_level(logging.WARNING, logger="billing.usage"):
        kept = recorder._write([event(gone) for _ in range(50)])
    recorder.stop()

    assert kept == []
    assert recorder.dropped == 50
    assert tries == [50, 1, 1, 1]
    assert caplog.text.count("usage events dropped: write failed") == 1

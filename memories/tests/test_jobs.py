"""Background adds: a PostgreSQL queue, worked with FOR UPDATE SKIP LOCKED."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from accounts import tiers
from accounts.tiers import Tier
from core import context, tenancy
from core.errors import Conflict, NotFound, QuotaExceeded, ValidationFailed
from memories import embeddings, jobs, services
from memories.models import Job, Memory
from tests.support import fill_memories


def enqueue(user_id, content="The user prefers tea.", tier=Tier.PRO, **kwargs):
    return services.remember(user_id=user_id, tier=tier, content=content, background=True, **kwargs)


def job_row(job_id) -> Job:
    with tenancy.operator():
        return Job.objects.get(id=job_id)


def test_an_async_remember_returns_a_queued_job_and_writes_no_memory_yet(cast):
    queued = enqueue(cast.alice.id)

    assert queued["status"] == "queued"
    assert len(queued["memory_ids"]) == 1
    assert services.list_memories(user_id=cast.alice.id) == []
    status = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (status["status"], status["memory_ids"]) == ("queued", queued["memory_ids"])


def test_a_worker_stores_the_memory_under_the_announced_id_and_settles_the_job(cast):
    with context.acting_as("mcp", cast.alice_key.key.id):
        queued = enqueue(cast.alice.id, priority="high", metadata={"k": "v"})

    assert services.run_next_job() is True
    assert services.run_next_job() is False  # nothing else is due

    [memory] = services.list_memories(user_id=cast.alice.id)
    assert memory["id"] == queued["memory_ids"][0]
    assert (memory["priority"], memory["metadata"]) == ("high", {"k": "v"})
    status = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert status["status"] == "done"
    assert status["memory_ids"] == queued["memory_ids"]
    assert status["memories"] == [{"id": queued["memory_ids"][0], "deduped": False}]
    # The worker acted as whoever queued the job.
    [created] = services.memory_history(user_id=cast.alice.id, id=memory["id"])
    assert (created["client"], created["api_key_id"]) == ("mcp", str(cast.alice_key.key.id))


def test_a_finished_job_keeps_ids_but_never_the_content(cast):
    queued = enqueue(cast.alice.id, content="a private thought")
    assert "a private thought" in str(job_row(queued["job_id"]).payload)

    services.run_next_job()

    row = job_row(queued["job_id"])
    assert row.payload is None
    assert "a private thought" not in str(row.result)


def test_content_already_stored_is_announced_and_reported_with_its_own_id(cast):
    existing = services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="known")["id"]
    queued = enqueue(cast.alice.id, content="known")

    # Announced at once with the id it will keep, so the caller can use it.
    assert queued["memory_ids"] == [existing]
    services.run_next_job()

    status = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert status["memories"] == [{"id": existing, "deduped": True}]
    assert status["memory_ids"] == [existing]


def test_content_forgotten_before_its_job_runs_is_stored_under_a_new_id(cast):
    existing = services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="known")["id"]
    queued = enqueue(cast.alice.id, content="known")
    services.forget(user_id=cast.alice.id, mode="by_id", id=existing)

    services.run_next_job()

    [memory] = services.list_memories(user_id=cast.alice.id)
    assert memory["content"] == "known"
    # Never the forgotten memory's id, whose history stays its own.
    assert memory["id"] != existing
    status = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert status["memories"] == [{"id": memory["id"], "deduped": False}]


def test_the_same_content_queued_twice_is_announced_with_one_id(cast):
    # The second add found nothing stored yet and announced an id of its own,
    # which never held a memory: its job found the first's.
    first = enqueue(cast.alice.id, content="The office wifi is harbour-lights-42.")
    second = enqueue(cast.alice.id, content="The office wifi is harbour-lights-42.")
    other = enqueue(cast.alice.id, content="The office wifi is harbour-lights-42.", namespace="n")

    assert second["memory_ids"] == first["memory_ids"]
    assert other["memory_ids"] != first["memory_ids"]  # another namespace: its own
    # Whichever job runs first stores it under the id both announced.
    with tenancy.operator():
        Job.objects.filter(id=first["job_id"]).update(run_after=timezone.now() + timedelta(hours=1))
    while services.run_next_job():
        pass
    [stored] = services.list_memories(user_id=cast.alice.id)
    assert stored["id"] == first["memory_ids"][0]
    status = services.job_status(user_id=cast.alice.id, job_id=second["job_id"])
    assert status["memories"] == [{"id": stored["id"], "deduped": False}]
    with tenancy.operator():
        Job.objects.filter(id=first["job_id"]).update(run_after=timezone.now())
    services.run_next_job()
    status = services.job_status(user_id=cast.alice.id, job_id=first["job_id"])
    assert status["memories"] == [{"id": stored["id"], "deduped": True}]


def test_an_id_borrowed_from_a_memory_forgotten_before_the_job_ran_is_not_reused(cast):
    first = enqueue(cast.alice.id, content="The office wifi is harbour-lights-42.")
    second = enqueue(cast.alice.id, content="The office wifi is harbour-lights-42.")
    services.run_next_job()
    services.forget(user_id=cast.alice.id, mode="by_id", id=first["memory_ids"][0])

    services.run_next_job()

    [stored] = services.list_memories(user_id=cast.alice.id)
    assert stored["id"] not in first["memory_ids"]
    status = services.job_status(user_id=cast.alice.id, job_id=second["job_id"])
    assert status["memories"] == [{"id": stored["id"], "deduped": False}]


def test_a_borrowed_id_taken_between_the_check_and_the_insert_is_run_again(
    cast, monkeypatch, caplog
):
    # Two runs of adds that share an id, at once: the one that inserts second
    # meets the id taken. Its job is queued again, and its next run finds the
    # id held and takes a new one.
    from memories.services import queue

    first = enqueue(cast.alice.id, content="The office wifi is harbour-lights-42.")
    second = enqueue(cast.alice.id, content="The office wifi is harbour-lights-42.")
    services.run_next_job()
    taken = first["memory_ids"][0]
    services.update_memory(user_id=cast.alice.id, id=taken, content="The wifi was retired.")
    monkeypatch.setattr(queue, "_free_ids", lambda user_id, agent_id, ids: set(ids))

    services.run_next_job()

    assert job_row(second["job_id"]).status == "queued"
    assert "job failed" not in caplog.text
    monkeypatch.undo()
    with tenancy.operator():
        Job.objects.filter(id=second["job_id"]).update(run_after=timezone.now())
    services.run_next_job()
    status = services.job_status(user_id=cast.alice.id, job_id=second["job_id"])
    [stored] = status["memories"]
    assert stored["id"] != taken and not stored["deduped"]


def test_an_announced_id_another_add_stored_and_a_delete_took_is_not_stored_again(cast):
    # The second add ran first under the id both announced; the memory was
    # deleted; the first add then stored its content under that id again: a
    # deleted id alive, with no "created" version of its own.
    first = enqueue(cast.alice.id, content="The office wifi is harbour-lights-42.")
    second = enqueue(cast.alice.id, content="The office wifi is harbour-lights-42.")
    [announced] = first["memory_ids"]
    with tenancy.operator():
        Job.objects.filter(id=first["job_id"]).update(run_after=timezone.now() + timedelta(hours=1))
    services.run_next_job()
    services.forget(user_id=cast.alice.id, mode="by_id", id=announced)
    with tenancy.operator():
        Job.objects.filter(id=first["job_id"]).update(run_after=timezone.now())

    services.run_next_job()

    [stored] = services.list_memories(user_id=cast.alice.id)
    assert stored["id"] != announced
    assert job_row(second["job_id"]).status == "done"
    with tenancy.operator():
        assert not Memory.objects.filter(id=announced).exists()


def test_a_conversations_jobs_are_taken_one_at_a_time_in_the_order_they_came(cast):
    # Two workers took two jobs of one thread at once: the later one's turns
    # could go in first, and a retry was stored again.
    def turns(*lines: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": line} for line in lines]

    def queue(*lines: str) -> Any:
        return services.remember(
            user_id=cast.alice.id,
            tier=Tier.PRO,
            messages=turns(*lines),
            thread_id="t",
            background=True,
        )

    first, second = queue("A", "B"), queue("C", "D")
    other = enqueue(cast.alice.id, content="A note of its own.")
    with tenancy.operator():
        taken = Job.objects.take_next(lease_seconds=60, lost_runs=3)
        after = Job.objects.take_next(lease_seconds=60, lost_runs=3)
        none = Job.objects.take_next(lease_seconds=60, lost_runs=3)

    assert taken is not None and str(taken.id) == first["job_id"]
    assert after is not None and str(after.id) == other["job_id"]  # not the thread's second
    assert none is None
    assert job_row(second["job_id"]).status == "queued"


def test_content_stored_by_another_add_between_the_look_and_the_quota_is_no_new_memory(
    cast, monkeypatch
):
    # At the free tier's limit, two adds of the same content ran together: the
    # second looked before the first committed, counted the content as new,
    # and was refused the quota by the first's memory.
    from memories.services import storing

    fill_memories(cast.alice.id, tiers.memory_limit(Tier.FREE) - 1)
    kept = services.remember(user_id=cast.alice.id, tier=Tier.FREE, content="The last one.")
    looks = {"n": 0}
    real = storing._held_by_place

    def first_look_misses(*args, **kwargs):
        looks["n"] += 1
        return {} if looks["n"] == 1 else real(*args, **kwargs)

    monkeypatch.setattr(storing, "_held_by_place", first_look_misses)
    [again] = storing.store(
        user_id=cast.alice.id,
        tier=Tier.FREE,
        call=services.remembering(content="The last one."),
        ids=[uuid.uuid4()],
        finish=lambda results: None,
    )

    assert again == {"id": kept["id"], "deduped": True}


def test_the_same_content_queued_twice_counts_once_against_the_quota(cast):
    fill_memories(cast.alice.id, tiers.memory_limit(Tier.FREE) - 1)

    enqueue(cast.alice.id, content="The last one.", tier=Tier.FREE)
    again = enqueue(cast.alice.id, content="The last one.", tier=Tier.FREE)

    assert again["status"] == "queued"
    with pytest.raises(QuotaExceeded):
        enqueue(cast.alice.id, content="One too many.", tier=Tier.FREE)


def test_content_already_stored_does_not_count_against_the_quota(cast):
    # One memory short of the free tier's limit: the same content again is
    # no new memory, neither when queued nor while it waits.
    fill_memories(cast.alice.id, tiers.memory_limit(Tier.FREE) - 2)
    existing = services.remember(user_id=cast.alice.id, tier=Tier.FREE, content="known")["id"]

    queued = enqueue(cast.alice.id, content="known", tier=Tier.FREE)
    last = enqueue(cast.alice.id, content="something new", tier=Tier.FREE)

    assert queued["memory_ids"] == [existing]
    assert last["status"] == "queued"
    with pytest.raises(QuotaExceeded):
        enqueue(cast.alice.id, content="one too many", tier=Tier.FREE)


def test_a_retry_with_the_same_idempotency_key_returns_the_first_job(cast):
    first = enqueue(cast.alice.id, idempotency_key="order-17")
    again = enqueue(cast.alice.id, idempotency_key="order-17")

    assert again == first
    with tenancy.operator():
        assert Job.objects.count() == 1
    services.run_next_job()
    after = enqueue(cast.alice.id, idempotency_key="order-17")
    assert (after["job_id"], after["status"]) == (first["job_id"], "done")


def test_an_idempotency_key_reused_for_another_request_is_a_conflict(cast):
    enqueue(cast.alice.id, content="one thing", idempotency_key="k1")

    with pytest.raises(Conflict, match="different request"):
        enqueue(cast.alice.id, content="another thing", idempotency_key="k1")


def test_a_ttl_retried_later_is_still_the_same_request(cast):
    first = enqueue(cast.alice.id, ttl_seconds=3600, idempotency_key="ttl")
    time.sleep(0.01)

    assert enqueue(cast.alice.id, ttl_seconds=3600, idempotency_key="ttl") == first


def test_idempotency_keys_are_per_user(cast):
    alice = enqueue(cast.alice.id, idempotency_key="shared-key")
    charlie = enqueue(cast.charlie.id, idempotency_key="shared-key")

    assert alice["job_id"] != charlie["job_id"]


def test_an_idempotency_key_needs_async(cast):
    with pytest.raises(ValidationFailed, match="applies to async"):
        services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="x", idempotency_key="k")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"content": ""}, "content must not be empty"),
        ({"priority": "urgent"}, "priority must be"),
        ({"ttl_seconds": 0}, "ttl_seconds must be"),
        ({"namespace": "no spaces"}, "namespace must be"),
    ],
)
def test_a_bad_call_is_refused_at_once_and_queues_nothing(cast, kwargs, fragment):
    with pytest.raises(ValidationFailed, match=fragment):
        enqueue(cast.alice.id, **kwargs)

    with tenancy.operator():
        assert Job.objects.count() == 0


def test_the_quota_is_checked_when_queuing_counting_jobs_already_queued(cast, settings):
    settings.FREE_TIER_MAX_MEMORIES = 3
    fill_memories(cast.alice.id, 1)
    enqueue(cast.alice.id, content="two", tier=Tier.FREE)
    enqueue(cast.alice.id, content="three", tier=Tier.FREE)

    with pytest.raises(QuotaExceeded):
        enqueue(cast.alice.id, content="four", tier=Tier.FREE)


def test_a_direct_add_leaves_the_places_queued_adds_were_promised(cast, settings):
    # A direct add counted stored memories only, took the place promised to a
    # queued add, and the job accepted as queued later failed quota_exceeded.
    settings.FREE_TIER_MAX_MEMORIES = 3
    fill_memories(cast.alice.id, 1)
    queued = [enqueue(cast.alice.id, content=c, tier=Tier.FREE) for c in ("two", "three")]

    with pytest.raises(QuotaExceeded):
        services.remember(user_id=cast.alice.id, tier=Tier.FREE, content="four")

    while services.run_next_job():
        pass
    for job in queued:
        assert job_row(job["job_id"]).status == "done"


def test_jobs_are_invisible_to_other_tenants(cast):
    queued = enqueue(cast.alice.id)

    with pytest.raises(NotFound):
        services.job_status(user_id=cast.charlie.id, job_id=queued["job_id"])
    with tenancy.tenant(cast.charlie.id), connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM memory_jobs")
        assert cursor.fetchone()[0] == 0


def test_a_job_id_that_is_not_a_uuid_is_a_validation_error(cast):
    with pytest.raises(ValidationFailed, match="job_id"):
        services.job_status(user_id=cast.alice.id, job_id="nope")
    with pytest.raises(NotFound):
        services.job_status(user_id=cast.alice.id, job_id=str(uuid.uuid4()))


def test_a_job_whose_worker_died_is_taken_again_when_its_lease_runs_out(cast):
    queued = enqueue(cast.alice.id)
    with tenancy.operator(), connection.cursor() as cursor:
        # As a worker does on taking it; then the worker is gone.
        cursor.execute(
            "UPDATE memory_jobs SET status = 'running', attempts = 1,"
            " lease_until = statement_timestamp() + interval '1 minute' WHERE id = %s",
            [queued["job_id"]],
        )
    assert services.run_next_job() is False

    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memory_jobs SET lease_until = statement_timestamp() - interval '1 second'"
        )
    assert services.run_next_job() is True

    status = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (status["status"], status["attempts"]) == ("done", 2)


def test_a_run_cut_off_by_a_database_outage_is_queued_again_once_it_answers(
    cast, monkeypatch, settings
):
    # It stayed "running" for its whole lease (five minutes) though its worker
    # lived, and the run was counted as lost: three outages failed the job.
    import psycopg

    from memories.services import queue

    queued = enqueue(cast.alice.id)
    real = queue.store

    def cut_off(**kwargs):
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(queue, "store", cut_off)
    with pytest.raises(psycopg.OperationalError):
        services.run_next_job()
    assert (job_row(queued["job_id"]).status, job_row(queued["job_id"]).attempts) == (
        "running",
        1,
    )

    settings.JOB_POLL_SECONDS = 0.5  # the back-off is two polls after one failure
    monkeypatch.setattr(queue, "store", real)
    assert services.run_next_job() is False  # queued again, with back-off
    assert job_row(queued["job_id"]).status == "queued"
    time.sleep(1.5)
    assert services.run_next_job() is True

    row = job_row(queued["job_id"])
    # A passing failure, as an embedder's, not a run lost to a dead worker.
    assert (row.status, row.attempts, row.lost_runs, row.failures) == ("done", 2, 0, 1)


def test_a_job_whose_runs_keep_cutting_the_database_off_is_not_run_for_ever(
    cast, monkeypatch, settings
):
    # Handed back at once every time, a job that crashes the database itself
    # would be run again without end: each outage counts as a failure, and
    # the job fails as unavailable on its last try.
    import psycopg

    from memories.services import queue

    settings.JOB_POLL_SECONDS = 0.05
    settings.JOB_MAX_ATTEMPTS = 3
    queued = enqueue(cast.alice.id)

    def cut_off(**kwargs):
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(queue, "store", cut_off)
    for _ in range(settings.JOB_MAX_ATTEMPTS):
        with pytest.raises(psycopg.OperationalError):  # run, once due again
            for _ in range(40):
                services.run_next_job()
                time.sleep(0.05)
    assert services.run_next_job() is False

    status = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (status["status"], status["error"]["code"]) == ("failed", "unavailable")
    assert job_row(queued["job_id"]).payload is None


def test_a_retry_that_fails_for_another_reason_than_the_database_stops_no_worker(cast, monkeypatch):
    # The retry of a run cut off by an outage came before taking any job: an
    # error of its own, repeated at every poll, would have stopped the workers.
    from memories.services import queue

    def broken(*args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(queue, "_retry_or_fail", broken)
    monkeypatch.setattr(queue, "_interrupted", {(uuid.uuid4(), 1)})
    queued = enqueue(cast.alice.id)

    assert services.run_next_job() is True

    assert queue._interrupted == set()
    assert services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])["status"] == "done"


class Broken(embeddings.Embedder):
    model_id = "broken"
    default_threshold = 0.5
    dimensions = 384
    is_loaded = True

    def embed(self, texts):
        raise RuntimeError("the model fell over")

    def load(self):
        pass


def test_a_passing_failure_is_retried_then_fails_with_its_code(cast, settings, monkeypatch):
    settings.JOB_MAX_ATTEMPTS = 2
    settings.JOB_POLL_SECONDS = 0.05
    queued = enqueue(cast.alice.id)
    monkeypatch.setattr(embeddings, "get_embedder", lambda: Broken())

    assert services.run_next_job() is True
    row = job_row(queued["job_id"])
    assert (row.status, row.attempts) == ("queued", 1)  # retried later, with back-off

    time.sleep(0.2)
    assert services.run_next_job() is True

    status = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert status["status"] == "failed"
    assert status["error"]["code"] == "embedding_unavailable"
    assert job_row(queued["job_id"]).payload is None


def test_a_failure_no_retry_can_fix_fails_at_once(cast, settings):
    settings.FREE_TIER_MAX_MEMORIES = 1
    queued = enqueue(cast.alice.id, tier=Tier.FREE)
    fill_memories(cast.alice.id, 1)  # the quota filled up while the job waited

    services.run_next_job()

    status = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (status["status"], status["error"]["code"], status["attempts"]) == (
        "failed",
        "quota_exceeded",
        1,
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("call", ["forget", "update", "history"])
def test_a_call_naming_a_memory_an_async_add_announced_waits_for_it(cast, call):
    # add_memory (async by default) answered an id that delete_memory, called
    # at once, did not find: the client's delete was lost and the memory kept.
    queued = enqueue(cast.alice.id, content="The user prefers green tea.")
    [memory_id] = queued["memory_ids"]

    def worker() -> None:
        try:
            time.sleep(0.5)
            services.run_next_job()
        finally:
            connection.close()

    later = threading.Thread(target=worker)
    later.start()
    mine = {"user_id": cast.alice.id, "id": memory_id}
    if call == "forget":
        assert services.forget_by_id(**mine) == {"success": True}
        assert services.list_memories(user_id=cast.alice.id) == []
    elif call == "update":
        services.update_memory(**mine, content="The user prefers oolong.")
        [listed] = services.list_memories(user_id=cast.alice.id)
        assert listed["content"] == "The user prefers oolong."
    else:
        assert services.memory_history(**mine)[0]["action"] == "created"
    later.join(30)


def test_a_memory_still_on_its_way_is_refused_naming_its_job(cast, monkeypatch):
    from memories.services import announced

    monkeypatch.setattr(announced, "ANNOUNCED_WAIT_SECONDS", 0.2)
    queued = enqueue(cast.alice.id)  # no worker runs it
    [memory_id] = queued["memory_ids"]

    with pytest.raises(NotFound) as caught:
        services.forget_by_id(user_id=cast.alice.id, id=memory_id)

    assert caught.value.message == (
        f"No memory with id {memory_id} yet: the background add that announced it"
        f" (job {queued['job_id']}) is still queued. Try again shortly, or check it with"
        " job_status."
    )
    with pytest.raises(NotFound) as caught:
        services.forget_by_id(user_id=cast.charlie.id, id=memory_id)
    assert caught.value.message == f"No memory with id {memory_id}."


def test_an_id_an_async_add_found_stored_already_is_not_waited_for(cast):
    # The add names the stored memory's id; forgotten, it is stored again
    # under another: a call naming the first id waited, and was told "yet".
    stored = services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="Tea, no sugar.")
    queued = enqueue(cast.alice.id, content="Tea, no sugar.")
    assert queued["memory_ids"] == [stored["id"]]
    services.forget_by_id(user_id=cast.alice.id, id=stored["id"])

    began = time.monotonic()
    with pytest.raises(NotFound) as caught:
        services.forget_by_id(user_id=cast.alice.id, id=stored["id"])

    assert caught.value.message == f"No memory with id {stored['id']}."
    assert time.monotonic() - began < 1


def test_a_job_not_due_within_the_wait_is_named_at_once(cast):
    # Backed off (the embedder failing), it would not run within the wait:
    # the call is told at once that the memory is on its way, not that there
    # is none (a client would take that for gone, and the add store it later).
    queued = enqueue(cast.alice.id)
    [memory_id] = queued["memory_ids"]
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memory_jobs SET run_after = statement_timestamp() + interval '1 minute'"
        )

    began = time.monotonic()
    with pytest.raises(NotFound) as caught:
        services.update_memory(user_id=cast.alice.id, id=memory_id.upper(), content="x")

    assert time.monotonic() - began < 1
    assert f"(job {queued['job_id']}) is still queued" in caught.value.message


@pytest.mark.django_db(transaction=True)
def test_concurrent_workers_each_take_different_jobs_and_run_each_once(cast):
    queued = [enqueue(cast.alice.id, content=f"memory number {n}") for n in range(24)]
    ran: list[bool] = []

    def worker() -> None:
        try:
            while services.run_next_job():
                ran.append(True)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert len(ran) == 24
    statuses = [services.job_status(user_id=cast.alice.id, job_id=q["job_id"]) for q in queued]
    assert {s["status"] for s in statuses} == {"done"}
    assert {s["attempts"] for s in statuses} == {1}
    assert len(services.list_memories(user_id=cast.alice.id, limit=100)) == 24


@pytest.mark.django_db(transaction=True)
@override_settings(JOB_POLL_SECONDS=0.2)
def test_queued_jobs_survive_until_workers_start_and_are_then_run(cast):
    # Queued while no worker runs: nothing happens, and nothing is lost.
    queued = [enqueue(cast.alice.id, content=f"waiting {n}") for n in range(3)]

    running = jobs.Workers(threads=2, maintenance=False).start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            statuses = {
                services.job_status(user_id=cast.alice.id, job_id=q["job_id"])["status"]
                for q in queued
            }
            if statuses == {"done"}:
                break
            time.sleep(0.05)
    finally:
        running.stop()

    assert statuses == {"done"}


@pytest.mark.django_db(transaction=True)
@override_settings(FREE_TIER_MAX_MEMORIES=5)
def test_concurrent_queuing_at_the_quota_lets_exactly_one_through(cast):
    fill_memories(cast.alice.id, 4)
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def worker(n: int) -> None:
        try:
            barrier.wait()
            enqueue(cast.alice.id, content=f"racing {n}", tier=Tier.FREE)
            outcomes.append("queued")
        except QuotaExceeded:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(outcomes) == ["queued"] + ["refused"] * 5


@pytest.mark.django_db(transaction=True)
def test_deleting_a_namespace_in_one_call_takes_the_adds_queued_before_it(cast, monkeypatch):
    # Seed 001's add_memory queues; an add then delete_all_memories deleted
    # nothing, and the memories appeared once the worker ran.
    queued = [enqueue(cast.alice.id, content=f"Fact number {n} about tea.") for n in range(3)]
    elsewhere = enqueue(cast.alice.id, content="Kept: another namespace.", namespace="other")

    def worker() -> None:
        try:
            time.sleep(0.5)
            services.run_next_job()  # the first add runs while the delete waits
        finally:
            connection.close()

    from memories.services import announced

    monkeypatch.setattr(announced, "ANNOUNCED_WAIT_SECONDS", 1.5)
    later = threading.Thread(target=worker)
    later.start()
    done = services.forget_namespace(user_id=cast.alice.id, namespace="default")
    later.join(30)
    while services.run_next_job():  # what is left to run runs now
        pass

    assert done["deleted_count"] == 1  # the one stored while it waited
    assert [m["content"] for m in services.list_memories(user_id=cast.alice.id)] == []
    kept = services.list_memories(user_id=cast.alice.id, namespace="other")
    assert [m["content"] for m in kept] == ["Kept: another namespace."]
    outcomes = sorted(job_row(q["job_id"]).status for q in queued)
    assert outcomes == ["done", "failed", "failed"]
    [withdrawn, *_] = [job_row(q["job_id"]) for q in queued if job_row(q["job_id"]).error_code]
    assert withdrawn.error_code == "conflict"
    assert "Withdrawn: delete_all_memories emptied" in withdrawn.error_message
    assert job_row(elsewhere["job_id"]).status == "done"


def test_a_queued_add_that_loses_a_race_is_run_again_not_failed(cast, monkeypatch):
    """review138: a lost race (a Conflict) failed the job for good, its accepted add lost."""
    from core.errors import LostRace
    from memories.services import queue

    queued = enqueue(cast.alice.id, content="The user prefers green tea.")
    original, lost = queue.store, []

    def loses_once(**kwargs: Any) -> Any:
        if not lost:
            lost.append(True)
            raise LostRace()
        return original(**kwargs)

    monkeypatch.setattr(queue, "store", loses_once)
    assert services.run_next_job() is True

    row = job_row(queued["job_id"])
    assert (row.status, row.attempts) == ("queued", 1)  # run again later, not failed


def _queued_import(user_id, minutes_ago: int) -> Job:
    with tenancy.operator():
        return Job.objects.create(
            user_id=user_id,
            kind="import",
            request_hash="0" * 64,
            payload={"filename": "big.jsonl"},
            run_after=timezone.now() - timedelta(minutes=minutes_ago),
        )


def _take(imports: bool = True):
    with tenancy.operator():
        return Job.objects.take_next(60, 3, imports=imports)


def test_adds_are_taken_before_imports_and_a_users_imports_one_at_a_time(cast):
    """review140: five uploads by one user took both workers, and another user's
    add queued after them waited over four minutes: the queue was first in,
    first out, whatever the job."""
    first = _queued_import(cast.alice.id, minutes_ago=10)
    second = _queued_import(cast.alice.id, minutes_ago=9)
    charlies = _queued_import(cast.charlie.id, minutes_ago=8)
    add = enqueue(cast.alice.id, content="Alice's add, queued last.")

    assert _take().id == uuid.UUID(add["job_id"])  # the add, though the newest
    assert _take().id == first.id
    # Alice's second upload waits for her first; Charlie's runs beside it.
    assert _take().id == charlies.id
    assert _take() is None
    with tenancy.operator():
        Job.objects.filter(id=first.id).update(status="done", lease_until=None)
    assert _take().id == second.id


def test_a_worker_kept_for_adds_takes_no_import(cast):
    _queued_import(cast.alice.id, minutes_ago=10)
    assert _take(imports=False) is None
    add = enqueue(cast.charlie.id, content="Charlie's add.")
    assert _take(imports=False).id == uuid.UUID(add["job_id"])


@pytest.mark.django_db(transaction=True)
@override_settings(JOB_POLL_SECONDS=0.2)
def test_with_two_workers_an_add_runs_while_an_import_holds_the_other(cast, monkeypatch):
    from memories.services import queue

    started, release = threading.Event(), threading.Event()

    def slow_import(taken) -> None:
        started.set()
        release.wait(30)
        with tenancy.operator():
            Job.objects.filter(id=taken.id).update(status="done", lease_until=None)

    monkeypatch.setitem(queue.RUNNERS, "import", slow_import)
    for minutes in (10, 9):
        _queued_import(cast.alice.id, minutes_ago=minutes)
    _queued_import(cast.charlie.id, minutes_ago=8)
    running = jobs.Workers(threads=2, maintenance=False).start()
    try:
        assert started.wait(30)
        add = enqueue(cast.alice.id, content="An add, behind three uploads.")
        deadline = time.monotonic() + 30
        while services.job_status(user_id=cast.alice.id, job_id=add["job_id"])["status"] != "done":
            assert time.monotonic() < deadline, "the add waited behind the uploads"
            time.sleep(0.1)
    finally:
        release.set()
        running.stop()


@pytest.mark.django_db(transaction=True)
def test_two_workers_taking_at_once_never_run_one_users_imports_together(cast):
    """review148: each worker's statement could not see the other's take before it
    committed, and skipped past the locked import to the same user's next one."""
    for minutes in (10, 9):
        _queued_import(cast.alice.id, minutes_ago=minutes)
    taken: dict[str, Any] = {}
    first_took, release = threading.Event(), threading.Event()

    def first() -> None:
        try:
            with tenancy.operator():
                taken["first"] = Job.objects.take_next(60, 3)
                first_took.set()
                release.wait(30)  # its take not committed yet
        finally:
            connection.close()

    def second() -> None:
        try:
            taken["second"] = _take()
        finally:
            connection.close()

    one = threading.Thread(target=first)
    one.start()
    assert first_took.wait(30)
    two = threading.Thread(target=second)
    two.start()
    two.join(1.0)  # waits for the first take to commit
    release.set()
    one.join(30)
    two.join(30)

    assert taken["first"] is not None and taken["first"].kind == "import"
    assert taken["second"] is None

"""A job's lease: a slow run keeps its job, and a job taken over is written once.

A run is held in its embedder (``Gate``) while the test plays the other
worker: it expires the lease, as a missed heartbeat would, and takes the
job over with ``run_next_job``. Imports (jobs of kind "import") are held
the same way, in the embedder of their first batch. The tests run on committed rows
(``transaction=True``), since each run has its own connection.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from accounts.tiers import Tier
from core import tenancy
from memories import embeddings, jobs, services
from memories.models import ImportChunk, Job, Memory
from memories.services import queue
from memories.tests.importing import FIXTURES

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = [
    {"role": "user", "content": "I moved to Lisbon in May."},
    {"role": "assistant", "content": "Noted: you live in Lisbon now."},
]


class Gate(embeddings.Embedder):
    """The real embedder, except that the threads named ``slow`` wait in it to be let go."""

    def __init__(self, real: embeddings.Embedder, *slow: str, fail: bool = False) -> None:
        self.real = real
        self.fail = fail
        self.model_id = real.model_id
        self.default_threshold = real.default_threshold
        self.entered = {name: threading.Event() for name in slow}
        self.released = {name: threading.Event() for name in slow}

    def wait_for(self, name: str) -> None:
        assert self.entered[name].wait(30), f"{name} never reached the embedder"

    def let_go(self, name: str) -> None:
        self.released[name].set()

    @property
    def dimensions(self) -> int:
        return self.real.dimensions

    @property
    def is_loaded(self) -> bool:
        return self.real.is_loaded

    def load(self) -> None:
        self.real.load()

    def embed(self, texts):
        name = threading.current_thread().name
        if name in self.released:
            self.entered[name].set()
            assert self.released[name].wait(30), f"the test never let {name} go"
            if self.fail:
                raise RuntimeError("the model fell over")
        return self.real.embed(texts)


@pytest.fixture
def gate(monkeypatch) -> Iterator[Callable[..., Gate]]:
    """Return a function that puts a Gate in the embedder's place; all are let go at the end."""
    made: list[Gate] = []

    def install(*slow: str, fail: bool = False) -> Gate:
        held = Gate(embeddings.get_embedder(), *slow, fail=fail)
        monkeypatch.setattr(embeddings, "get_embedder", lambda: held)
        made.append(held)
        return held

    yield install
    for held in made:
        for name in held.released:
            held.let_go(name)


def run_in_thread(name: str) -> threading.Thread:
    def run() -> None:
        try:
            services.run_next_job()
        finally:
            connection.close()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def expire_lease(job_id: str) -> None:
    # What a heartbeat missed for a whole lease leaves behind.
    with tenancy.operator(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memory_jobs SET lease_until = statement_timestamp() - interval '1 second'"
            " WHERE id = %s",
            [job_id],
        )


def job_row(job_id: str) -> Job:
    with tenancy.operator():
        return Job.objects.get(id=job_id)


def lost_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("job lost")]


def queue_conversation(cast) -> dict:
    return dict(
        services.remember(user_id=cast.alice.id, tier=Tier.PRO, messages=MESSAGES, background=True)
    )


def queue_import(cast, user=None) -> uuid.UUID:
    # Three good records and two refused, in one batch.
    return services.enqueue_import(
        user_id=(user or cast.alice).id,
        tier=Tier.PRO,
        filename="mem0.json",
        options={"format": "mem0"},
        chunks=[(FIXTURES / "mem0.json").read_bytes()],
    )


def contents(user) -> set[str]:
    with tenancy.tenant(user.id):
        return set(Memory.objects.filter(user_id=user.id).values_list("content", flat=True))


def test_memories_forgotten_after_a_taken_over_job_is_done_stay_forgotten(cast, gate, caplog):
    slow = gate("first-run")
    queued = queue_conversation(cast)
    first = run_in_thread("first-run")
    slow.wait_for("first-run")

    expire_lease(queued["job_id"])
    assert services.run_next_job() is True  # a second worker takes the job over
    done = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (done["status"], done["attempts"]) == ("done", 2)
    for memory_id in queued["memory_ids"]:
        services.forget(user_id=cast.alice.id, mode="by_id", id=memory_id)

    with caplog.at_level(logging.INFO, logger="memories"):
        slow.let_go("first-run")  # it finishes embedding, late
        first.join(30)

    assert not first.is_alive()
    assert services.list_memories(user_id=cast.alice.id) == []
    # Its result, started_at and finished_at are still the second run's.
    assert services.job_status(user_id=cast.alice.id, job_id=queued["job_id"]) == done
    [line] = lost_lines(caplog)
    assert (vars(line)["job_id"], vars(line)["attempt"]) == (queued["job_id"], 1)
    assert "Lisbon" not in str(vars(line))


def test_a_run_that_lost_its_job_writes_nothing_and_leaves_it_to_the_new_run(cast, gate):
    slow = gate("first-run", "second-run")
    queued = queue_conversation(cast)
    first = run_in_thread("first-run")
    slow.wait_for("first-run")
    expire_lease(queued["job_id"])
    second = run_in_thread("second-run")
    slow.wait_for("second-run")

    slow.let_go("first-run")  # the run that lost the job finishes first
    first.join(30)

    assert services.list_memories(user_id=cast.alice.id) == []
    row = job_row(queued["job_id"])
    assert (row.status, row.attempts, row.error_code, row.result) == ("running", 2, None, None)
    assert row.payload is not None  # the content is still the new run's to store

    slow.let_go("second-run")
    second.join(30)

    status = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (status["status"], status["attempts"]) == ("done", 2)
    stored = services.list_memories(user_id=cast.alice.id)
    assert sorted(m["id"] for m in stored) == sorted(queued["memory_ids"])
    assert {m["version"] for m in stored} == {1}


# With one attempt allowed, the failing run would fail the job; with three,
# queue it again.
@pytest.mark.parametrize("max_attempts", [1, 3])
def test_a_run_that_fails_after_losing_its_job_neither_requeues_nor_fails_it(
    cast, gate, settings, caplog, max_attempts
):
    settings.JOB_MAX_ATTEMPTS = max_attempts
    slow = gate("first-run", fail=True)
    queued = queue_conversation(cast)
    first = run_in_thread("first-run")
    slow.wait_for("first-run")
    expire_lease(queued["job_id"])
    assert services.run_next_job() is True
    done = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (done["status"], done["attempts"]) == ("done", 2)

    with caplog.at_level(logging.INFO, logger="memories"):
        slow.let_go("first-run")  # the embedder fails the run that lost the job
        first.join(30)

    assert services.job_status(user_id=cast.alice.id, job_id=queued["job_id"]) == done
    assert services.run_next_job() is False  # not queued again
    assert len(services.list_memories(user_id=cast.alice.id)) == 2
    assert len(lost_lines(caplog)) == 1


def test_the_heartbeat_extends_a_job_in_hand_only_while_its_run_has_it(cast, gate, settings):
    slow = gate("first-run")
    queued = queue_conversation(cast)
    first = run_in_thread("first-run")
    slow.wait_for("first-run")
    taken_until = job_row(queued["job_id"]).lease_until
    assert taken_until is not None

    settings.JOB_LEASE_SECONDS = 3600
    assert queue.extend_leases() == 1

    extended = job_row(queued["job_id"]).lease_until
    assert extended is not None and (extended - taken_until).total_seconds() > 3000
    expire_lease(queued["job_id"])
    services.run_next_job()  # taken over
    # The first run is still in hand, but the job is no longer its own.
    assert queue.extend_leases() == 0
    assert job_row(queued["job_id"]).lease_until is None
    slow.let_go("first-run")
    first.join(30)


def test_a_slow_job_keeps_its_worker_past_its_lease(cast, gate, settings):
    settings.JOB_LEASE_SECONDS = 1
    settings.JOB_POLL_SECONDS = 0.1
    slow = gate("job-worker-1")
    queued = queue_conversation(cast)

    running = jobs.Workers(threads=1, maintenance=False).start()
    try:
        slow.wait_for("job-worker-1")
        time.sleep(2.5)  # over two leases, each extended by the heartbeat
        assert services.run_next_job() is False  # nothing due: the job is still held
        slow.let_go("job-worker-1")
        deadline = time.monotonic() + 30
        while job_row(queued["job_id"]).status != "done" and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        slow.let_go("job-worker-1")
        running.stop()

    status = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (status["status"], status["attempts"]) == ("done", 1)


def test_the_heartbeat_lets_a_run_go_after_JOB_MAX_RUN_SECONDS_and_the_job_is_taken_again(
    cast, gate, settings, caplog
):
    settings.JOB_LEASE_SECONDS = 3600
    settings.JOB_MAX_RUN_SECONDS = 0.5
    slow = gate("first-run")  # a run that hangs in the embedder
    queued = queue_conversation(cast)
    first = run_in_thread("first-run")
    slow.wait_for("first-run")
    assert queue.extend_leases() == 1
    held_until = job_row(queued["job_id"]).lease_until

    time.sleep(0.6)
    with caplog.at_level(logging.INFO, logger="memories"):
        assert queue.extend_leases() == 0
        assert queue.extend_leases() == 0  # let go once, and said once

    assert job_row(queued["job_id"]).lease_until == held_until  # no longer extended
    [line] = [r for r in caplog.records if "JOB_MAX_RUN_SECONDS" in r.getMessage()]
    assert (vars(line)["job_id"], vars(line)["attempt"]) == (queued["job_id"], 1)
    assert "Lisbon" not in str(vars(line))

    expire_lease(queued["job_id"])  # as its lease runs out
    assert services.run_next_job() is True  # another worker takes it over
    done = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (done["status"], done["attempts"]) == ("done", 2)
    slow.let_go("first-run")  # the hung run wakes, late
    first.join(30)

    assert services.job_status(user_id=cast.alice.id, job_id=queued["job_id"]) == done
    stored = services.list_memories(user_id=cast.alice.id)
    assert sorted(m["id"] for m in stored) == sorted(queued["memory_ids"])


def lose_runs(job_id: str, runs: int) -> None:
    """Take the job ``runs`` times, each run dying with it (its lease runs out)."""
    for _ in range(runs):
        with tenancy.operator():
            taken = Job.objects.take_next(60, queue.LOST_RUNS)
        assert taken is not None and str(taken.id) == job_id
        expire_lease(job_id)


def test_a_job_whose_every_run_loses_its_worker_fails_instead_of_looping(cast, settings, caplog):
    # A job that kills (or hangs) whatever runs it: each run takes it and
    # dies, and its lease runs out. After LOST_RUNS such runs it fails,
    # whatever JOB_MAX_ATTEMPTS allows for failures of its own.
    settings.JOB_MAX_ATTEMPTS = 1
    queued = queue_conversation(cast)
    lose_runs(queued["job_id"], queue.LOST_RUNS)

    with caplog.at_level(logging.WARNING, logger="memories"):
        assert services.run_next_job() is False  # nothing left to take

    failed = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (failed["status"], failed["attempts"]) == ("failed", queue.LOST_RUNS)
    assert failed["error"]["code"] == "internal_error"
    assert "will not be run again" in failed["error"]["message"]
    row = job_row(queued["job_id"])
    assert row.payload is None and row.lease_until is None and row.finished_at is not None
    [line] = [r for r in caplog.records if r.getMessage().startswith("gave up jobs")]
    assert vars(line)["jobs"] == 1 and "Lisbon" not in str(vars(line))
    assert services.list_memories(user_id=cast.alice.id) == []
    assert services.run_next_job() is False  # and a later worker finds nothing either


def test_runs_that_failed_and_were_retried_are_no_lost_runs(cast, gate, settings):
    # Two runs fail for a passing reason and queue the job again; the third
    # loses its worker. It is taken over: only one run was lost, though three
    # of JOB_MAX_ATTEMPTS' runs are spent.
    settings.JOB_MAX_ATTEMPTS = 3
    settings.JOB_POLL_SECONDS = 0
    model = gate("MainThread", fail=True)
    model.let_go("MainThread")  # it falls over
    queued = queue_conversation(cast)
    for _ in range(2):
        assert services.run_next_job() is True
        assert job_row(queued["job_id"]).status == "queued"
    lose_runs(queued["job_id"], 1)
    assert job_row(queued["job_id"]).attempts == 3

    model.fail = False  # up again
    assert services.run_next_job() is True
    done = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (done["status"], done["attempts"]) == ("done", 4)


def test_lost_runs_spend_none_of_the_retries_JOB_MAX_ATTEMPTS_allows(cast, gate, settings):
    # Two runs lose their worker, then two fail for a passing reason: each
    # failure queues the job again (two of three), and the fifth run stores it.
    settings.JOB_MAX_ATTEMPTS = 3
    settings.JOB_POLL_SECONDS = 0
    model = gate("MainThread", fail=True)
    model.let_go("MainThread")
    queued = queue_conversation(cast)
    lose_runs(queued["job_id"], 2)
    for _ in range(2):
        assert services.run_next_job() is True
        assert job_row(queued["job_id"]).status == "queued"

    model.fail = False
    assert services.run_next_job() is True
    done = services.job_status(user_id=cast.alice.id, job_id=queued["job_id"])
    assert (done["status"], done["attempts"]) == ("done", 5)


def test_an_import_s_lost_runs_spend_none_of_its_retries(cast, settings, monkeypatch):
    # The same for an import: two runs lost, two that fail for a passing
    # reason (queued again), then one that imports the file.
    from core.errors import InternalError
    from memories.importers import job as import_job

    settings.JOB_MAX_ATTEMPTS = 3
    settings.JOB_POLL_SECONDS = 0
    real = import_job.run_import
    failing = [True, True]

    def flaky(**kwargs):
        if failing:
            failing.pop()
            raise InternalError("The model fell over.")
        return real(**kwargs)

    monkeypatch.setattr(import_job, "run_import", flaky)
    upload = queue_import(cast)
    lose_runs(str(upload), 2)
    for failures in (1, 2):
        assert services.run_next_job() is True
        row = job_row(str(upload))
        assert (row.status, row.failures) == ("queued", failures)

    assert services.run_next_job() is True
    row = job_row(str(upload))
    assert (row.status, row.attempts) == ("done", 5)


def test_an_import_given_up_keeps_its_report_and_deletes_its_file(cast, settings):
    upload = queue_import(cast)
    lose_runs(str(upload), queue.LOST_RUNS)
    # Another user's upload, waiting: its file stays.
    other = queue_import(cast, cast.charlie)

    with tenancy.operator():
        given_up = Job.objects.give_up_lost(queue.LOST_RUNS, "internal_error", "lost")
    assert given_up == 1

    row = job_row(str(upload))
    assert row.status == "failed" and row.error_code == "internal_error"
    assert row.payload and row.payload["filename"] == "mem0.json"  # shown on the dashboard
    with tenancy.operator():
        assert not ImportChunk.objects.filter(job_id=upload).exists()
        assert ImportChunk.objects.filter(job_id=other).exists()
        assert Job.objects.get(id=other).status == "queued"


def test_an_import_that_saves_progress_between_lost_runs_goes_on(cast):
    upload = queue_import(cast)
    lose_runs(str(upload), queue.LOST_RUNS - 1)
    # The next run (the last allowed) saves progress, and is lost too.
    with tenancy.operator():
        taken = Job.objects.take_next(60, queue.LOST_RUNS)
    assert taken is not None
    with tenancy.tenant(cast.alice.id):
        report = {"format": "mem0", "source": "mem0.json"}  # nothing read yet
        services.save_import_progress(job_id=upload, attempts=taken.attempts, report=report)
    expire_lease(str(upload))

    assert services.run_next_job() is True  # taken over, and run to its end
    assert job_row(str(upload)).status == "done"


def test_an_import_run_that_lost_its_job_stores_saves_and_settles_nothing(cast, gate, caplog):
    slow = gate("first-run", "second-run")
    job_id = queue_import(cast)
    first = run_in_thread("first-run")
    slow.wait_for("first-run")
    expire_lease(str(job_id))
    second = run_in_thread("second-run")
    slow.wait_for("second-run")

    with caplog.at_level(logging.INFO, logger="memories"):
        slow.let_go("first-run")  # the run that lost the job finishes first
        first.join(30)

    assert not first.is_alive()
    assert contents(cast.alice) == set()  # its batch rolled back
    row = job_row(str(job_id))
    assert (row.status, row.attempts, row.result, row.finished_at) == ("running", 2, None, None)
    with tenancy.operator():
        assert ImportChunk.objects.filter(job_id=job_id).exists()  # the file is the new run's
    [line] = [r for r in caplog.records if r.getMessage().startswith("import job lost")]
    assert (vars(line)["job_id"], vars(line)["attempt"]) == (str(job_id), 1)
    assert not [r for r in caplog.records if r.getMessage() == "import failed"]

    slow.let_go("second-run")
    second.join(30)

    row = job_row(str(job_id))
    assert (row.status, row.attempts) == ("done", 2)
    assert (row.result["imported"], row.result["refused"]) == (3, 2)
    assert len(contents(cast.alice)) == 3


def test_deleting_a_namespace_withdraws_an_add_already_running_into_it(cast, gate, monkeypatch):
    # Seed 001's delete_all_memories withdrew the adds still queued, but one
    # already running stored its memories after the delete had answered.
    from memories.services import announced

    monkeypatch.setattr(announced, "ANNOUNCED_WAIT_SECONDS", 0.3)
    slow = gate("running-add")
    queued = queue_conversation(cast)
    running = run_in_thread("running-add")
    slow.wait_for("running-add")

    done = services.forget_namespace(user_id=cast.alice.id, namespace="default")
    slow.let_go("running-add")
    running.join(30)

    assert not running.is_alive()
    assert done["deleted_count"] == 0
    assert contents(cast.alice) == set()
    withdrawn = job_row(queued["job_id"])
    assert (withdrawn.status, withdrawn.error_code) == ("failed", "conflict")
    assert "so its memories were not stored" in withdrawn.error_message

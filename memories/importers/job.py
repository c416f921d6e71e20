"""An import uploaded on the dashboard, run by a background worker (``memory_jobs``, kind "import").

The worker copies the uploaded file out of the database into a temporary
directory (the readers need a real file: SQLite and zip archives are read
by seeking), runs the import as the job's owner, and saves the report with
every batch, in that batch's transaction, so the dashboard shows progress
and an interrupted job resumes after the last batch it stored. Bad input
and a full quota fail the job at once with the message; a passing failure
(the embedding model, the database) is retried with back-off.

A run whose lease ran out while it went on, and whose job another run took,
saves, settles and requeues nothing: the batch it was storing rolls back and
the run stops, leaving the job to the run that has it.
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings

from core import context, errors
from core.errors import EmbeddingUnavailable, InternalError, RecallError
from core.logging import describe_exception
from memories import services
from memories.importers.run import Options, Report, run_import
from memories.importers.sources import Source
from memories.models import Taken
from memories.services import queue as job_queue

logger = logging.getLogger(__name__)


def run_taken(job: Taken) -> None:
    """Run an import job a worker has taken (``services.runs("import", ...)``)."""
    run(job.id, job.user_id, job.payload, job.attempts, job.result)


def run(
    job_id: uuid.UUID,
    user_id: uuid.UUID,
    payload: dict[str, Any],
    attempts: int,
    result: dict[str, Any] | None,
) -> None:
    try:
        _run(job_id, user_id, payload, attempts, result)
    except services.Stopping:
        # The batch in hand rolled back; the next start resumes after the last
        # one stored, this run not counted against the job.
        services.hand_back(job_id=job_id, attempts=attempts)
        logger.info("import handed back as the workers stop", extra={"job_id": str(job_id)})
    except services.JobLost:
        # Ids only: the payload names the user's file.
        logger.warning(
            "import job lost to another run; this run stopped",
            extra={"job_id": str(job_id), "attempt": attempts},
        )


def _run(
    job_id: uuid.UUID,
    user_id: uuid.UUID,
    payload: dict[str, Any],
    attempts: int,
    result: dict[str, Any] | None,
) -> None:
    label = payload["filename"]
    suffix = re.sub(r"[^A-Za-z0-9.]", "", Path(label).suffix)[:16]
    resume = Report.from_dict(result) if result else None
    # Past this the heartbeat lets the job go (queue.extend_leases): a reader
    # that could work without end stops there, and the job fails saying so.
    until = time.monotonic() + settings.JOB_MAX_RUN_SECONDS
    # Read here, on the worker's thread: the batches are stored from another.
    stop = job_queue.stop_signal()
    with tempfile.TemporaryDirectory(prefix="recall-import-") as tmp:
        path = Path(tmp) / f"upload{suffix}"
        with path.open("wb") as out:
            for piece in services.import_file(user_id=user_id, job_id=job_id):
                out.write(piece)
        try:
            with context.acting_as("import"):
                report = run_import(
                    user_id=user_id,
                    source=Source(path, label),
                    options=Options(**payload["options"]),
                    tier=payload.get("tier"),
                    resume=resume,
                    until=until,
                    checkpoint=lambda r: _checkpoint(job_id, attempts, r, stop),
                    stopping=stop.is_set if stop is not None else None,
                    cleared=lambda: services.cleared_namespaces(
                        user_id=user_id, job_id=job_id, attempts=attempts
                    ),
                )
        except (services.JobLost, services.Stopping):
            raise
        except (EmbeddingUnavailable, InternalError) as error:
            _again_or_fail(job_id, user_id, attempts, error)
        except RecallError as error:
            services.finish_import(
                user_id=user_id, job_id=job_id, attempts=attempts, report=None, error=error
            )
        except Exception as exc:
            if errors.database_away(exc):
                raise  # the database is away: the lease runs out and the job is taken again
            _again_or_fail(
                job_id, user_id, attempts, InternalError("The import failed on our side.")
            )
            # Logged only once this run is known to have had the job: a run
            # that lost it may trip over the other run's work.
            logger.error("import failed", extra={"job_id": str(job_id), **describe_exception(exc)})
        else:
            services.finish_import(
                user_id=user_id, job_id=job_id, attempts=attempts, report=report.as_dict()
            )


def _checkpoint(
    job_id: uuid.UUID, attempts: int, report: Report, stop: threading.Event | None
) -> None:
    """Save the report in the batch's transaction; or, as the workers stop, end the run
    there (``Stopping`` rolls the batch back, so it is stored by the next run)."""
    if stop is not None and stop.is_set():
        raise services.Stopping
    services.save_import_progress(job_id=job_id, attempts=attempts, report=report.as_dict())


def _again_or_fail(
    job_id: uuid.UUID, user_id: uuid.UUID, attempts: int, error: RecallError
) -> None:
    if not services.requeue_job(job_id=job_id, user_id=user_id, attempts=attempts, error=error):
        services.finish_import(
            user_id=user_id, job_id=job_id, attempts=attempts, report=None, error=error
        )

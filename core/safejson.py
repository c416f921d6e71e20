"""Parse JSON from a client without letting its shape crash the parser.

``json.loads`` recurses once per nesting level, so a body of a thousand ``[``
raises ``RecursionError``, which is no ``ValueError`` and so escaped every
``except ValueError`` that guarded a parse. ``loads`` turns every way a body
can fail to be JSON into ``ValueError``, and refuses nesting deeper than any
real request needs before it can get that far.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Deeper than any real payload (MCP envelopes, metadata, webhooks), and well
# under both Python's recursion limit and pydantic-core's parser limit (200),
# so what this accepts the MCP SDK also parses.
MAX_DEPTH = 100


class TooDeep(ValueError):
    """JSON nested deeper than ``MAX_DEPTH``: stdlib parsers would recurse on it."""


class TooLong(ValueError):
    """A JSON integer of more digits than Python converts (``sys.get_int_max_str_digits``)."""


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # valid JSON (the scanner matched it), so only its length is at fault
        raise TooLong("a JSON number too long to read") from None


def loads(data: bytes | str) -> Any:
    """Return the JSON value in ``data``; raise ValueError if it is not JSON, TooDeep (a
    ValueError) if it nests too deep, TooLong (one too) for an integer too long to read."""
    if isinstance(data, bytes | bytearray) and _too_deep(data):
        raise TooDeep("JSON nested too deeply")
    try:
        return json.loads(data, parse_int=_whole)
    except RecursionError:
        raise TooDeep("JSON nested too deeply") from None
    except (UnicodeDecodeError, TypeError) as exc:
        raise ValueError("not JSON") from exc


def _too_deep(data: bytes) -> bool:
    # Cheap pre-check: only bodies with many brackets pay for the scan.
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return False
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = 0
    for byte in brackets:
        depth += 1 if byte in b"[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


# A JSON string, escapes included; possessive, so a body of quotes cannot backtrack.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*+"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")

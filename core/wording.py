"""Validation failures in our words, for any interface that checks input against a schema.

Pydantic's messages speak its own language: class names ("instance of
Document"), its phrases ("Field required", "Input should be ..."), union
branch tags in locations (``metadata_filter.team.str``), and sometimes the
input itself. ``problem`` says instead, once per argument that failed, where
(``messages[2].content``, ``metadata_filter['team']``) and what is expected
there ("a whole number between 1 and 50"), read from the JSON Schema the
caller was shown, so the words match the published contract. Input values
never appear: memory content and queries are secret, and the caller has
them anyway.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from typing import Any

Schema = Mapping[str, Any]

# How many failing places one message names; the rest are counted.
SHOWN = 3

# Keys a caller chose (metadata_filter's) are named in paths, cut to this.
KEY_MAX = 64

# A character-class pattern (``^[...]+$``), which is described by its characters.
_CLASS_PATTERN = re.compile(r"^\^\[([^\]]+)\]\+\$$")


def problem(
    errors: Sequence[Mapping[str, Any]], schema: Schema, nulls: Collection[str] = ()
) -> str:
    """Return one message for validation ``errors`` against the object ``schema``.

    ``errors`` are pydantic's (``ValidationError.errors()``); only their
    location and type are read, never their message or input. ``nulls``
    names the arguments sent as null: a required one is said to be missing.
    """
    found: dict[str, str] = {}
    missing = set(schema.get("required") or ()) & set(nulls)
    for error in errors:
        path, node = locate(schema, error.get("loc", ()))
        if path in found:
            continue
        kind = "missing" if path in missing else str(error.get("type", ""))
        found[path] = sentence(path, node, kind, schema)
    if not found:
        return "The arguments are not valid."
    sentences = list(found.values())
    shown = " ".join(sentences[:SHOWN])
    more = len(sentences) - SHOWN
    if more > 0:
        shown += f" ({more} more {'problem' if more == 1 else 'problems'} not shown.)"
    return shown


def sentence(path: str, node: Schema, kind: str, root: Schema) -> str:
    """Say what is wrong at ``path``, whose schema is ``node``."""
    where = path or "The arguments"
    if kind in ("missing", "missing_argument"):
        return f"{where} is required."
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return f"{where} is not accepted here."
    wanted = expected(node, root, nested="." in path or "[" in path)
    if not wanted:
        return f"{where} is not valid."
    return f"{where} must be {wanted}."


def locate(schema: Schema, loc: Sequence[Any]) -> tuple[str, Schema]:
    """Follow a pydantic location through ``schema``: the path in plain words, and its schema.

    A union is described whole, so the walk stops at one and drops the rest
    of the location (pydantic's branch tags, such as ``str`` or
    ``literal['a','b']``).
    """
    path = ""
    node = _resolve(schema, schema)
    parts = list(loc)
    while True:
        options = _branches(node)
        if len(options) == 1:
            node = _resolve(options[0], schema)
            continue
        if len(options) > 1 or not parts:
            return path, node
        part = parts.pop(0)
        kind = node.get("type")
        if kind == "object" and isinstance(part, str):
            properties = node.get("properties") or {}
            if part in properties:
                path = f"{path}.{part}" if path else part
                node = _resolve(properties[part], schema)
                continue
            values = node.get("additionalProperties")
            path = f"{path}[{part[:KEY_MAX]!r}]" if path else part[:KEY_MAX]
            node = _resolve(values, schema) if isinstance(values, Mapping) else {}
            continue
        if kind == "array" and isinstance(part, int):
            path = f"{path}[{part}]"
            items = node.get("items")
            node = _resolve(items, schema) if isinstance(items, Mapping) else {}
            continue
        # A location the schema does not have (a validator's own tag): stop here.
        return path, node


def expected(node: Schema, root: Schema, *, nested: bool = False) -> str:
    """Describe what ``node`` accepts, as a phrase: "text of at most 64 characters"."""
    node = _resolve(node, root)
    if "anyOf" in node:
        return _either(node, root, nested)
    if "enum" in node:
        return "one of: " + ", ".join(_shown(value) for value in node["enum"])
    if "const" in node:
        return _shown(node["const"])
    kind = node.get("type")
    if kind == "string":
        return _text(node)
    if kind == "integer":
        return "a whole number" + _range(node)
    if kind == "number":
        return "a number" + _range(node)
    if kind == "boolean":
        return "true or false"
    if kind == "null":
        return "null"
    if kind == "array":
        return "a list" + _count(node, "item")
    if kind == "object":
        return _object(node)
    return ""


def _either(node: Schema, root: Schema, nested: bool) -> str:
    options = _branches(node)
    nullable = len(options) < len(node["anyOf"])
    if len(options) == 1:
        return expected(options[0], root)
    kinds = {_resolve(option, root).get("type") for option in options}
    phrases: list[str] = []
    for option in options:
        option = _resolve(option, root)
        # A whole number is a number: say it once.
        if option.get("type") == "integer" and "number" in kinds:
            continue
        items = option.get("items")
        if option.get("type") == "array" and isinstance(items, Mapping) and items in options:
            phrases.append("a list of them")
            continue
        phrase = expected(option, root)
        if phrase and phrase not in phrases:
            phrases.append(phrase)
    # null is a value worth naming inside a structure (a filter value may
    # be null); for a whole argument, leaving it out says the same.
    if nullable and nested:
        phrases.append("null")
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + ", or " + phrases[-1]


def _text(node: Schema) -> str:
    low = node.get("minLength")
    high = node.get("maxLength")
    if low and high:
        span = _number(low) if low == high else f"{_number(low)} to {_number(high)}"
        size = f" of {span} characters"
    elif high:
        size = f" of at most {_number(high)} characters"
    elif low:
        size = f" of at least {_number(low)} characters"
    else:
        size = ""
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        allowed = _characters(pattern)
        return f"text{size}" + (f" ({allowed})" if allowed else " in the documented form")
    return f"text{size}"


def _characters(pattern: str) -> str:
    """Name the characters a ``^[...]+$`` pattern allows: "letters, digits and _ - ."."""
    match = _CLASS_PATTERN.match(pattern)
    if match is None:
        return ""
    chars = match.group(1)
    named: list[str] = []
    for span, name in (("A-Za-z", "letters"), ("a-z", "lower-case letters"), ("0-9", "digits")):
        if span in chars:
            named.append(name)
            chars = chars.replace(span, "")
    if "A-Z" in chars:
        named.append("capital letters")
        chars = chars.replace("A-Z", "")
    others = [char for char in chars.replace("\\", "") if char.isprintable() and char != " "]
    if others:
        named.append(" ".join(others))
    if not named:
        return ""
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]


def _range(node: Schema) -> str:
    low = node.get("minimum")
    high = node.get("maximum")
    if low is not None and high is not None:
        return f" between {_number(low)} and {_number(high)}"
    if low is not None:
        return f" of at least {_number(low)}"
    if high is not None:
        return f" of at most {_number(high)}"
    return ""


def _count(node: Schema, noun: str) -> str:
    low = node.get("minItems") or node.get("minProperties")
    high = node.get("maxItems")
    if high is None:
        high = node.get("maxProperties")
    if low and high is not None:
        return f" of {_number(low)} to {_number(high)} {noun}s"
    if high is not None:
        return f" of at most {_number(high)} {noun}" + ("" if high == 1 else "s")
    if low:
        return f" of at least {_number(low)} {noun}" + ("" if low == 1 else "s")
    return ""


def _object(node: Schema) -> str:
    required = [str(name) for name in node.get("required") or []]
    if required:
        names = required[0] if len(required) == 1 else ", ".join(required[:-1])
        if len(required) > 1:
            names += " and " + required[-1]
        return f"an object with {names}"
    return "an object" + _count(node, "key")


def _branches(node: Schema) -> list[Schema]:
    """The options of a union other than null; empty for a node that is not a union."""
    options = node.get("anyOf")
    if not isinstance(options, list):
        return []
    return [option for option in options if option.get("type") != "null"]


def _resolve(node: Any, root: Schema) -> Schema:
    if not isinstance(node, Mapping):
        return {}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        found = (root.get("$defs") or {}).get(ref.rsplit("/", 1)[-1])
        return found if isinstance(found, Mapping) else {}
    return node


def _number(value: float) -> str:
    # As memories/validation.py words its limits: 50,000, not 50000.
    return f"{int(value):,}" if float(value).is_integer() else str(value)


def _shown(value: object) -> str:
    return "null" if value is None else str(value)


def quoted_name(name: str) -> str:
    """A name the caller sent (a tool's, an argument's), quoted in the message about it.

    At most 64 characters; a control character or a lone surrogate shows as
    U+FFFD, never as a Python escape.
    """
    shown = "".join(
        "\ufffd" if unicodedata.category(ch) in ("Cc", "Cs") else ch for ch in name[:64]
    )
    return f"'{shown}'"


def accepted(tool: str, declared: Sequence[str]) -> str:
    """Say which arguments ``tool`` takes, for a call that passed others."""
    if not declared:
        return f"{tool} takes no arguments."
    return f"{tool} takes: {', '.join(declared)}."

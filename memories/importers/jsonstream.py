"""Reading one large JSON document a value at a time.

mem0's get_all output and export, OpenMemory's ``memories.json`` and Letta's
agent files are single JSON documents whose bulk is one or two arrays. The
standard library parses a document whole; this reads the top level itself
and hands the elements of chosen arrays over one by one, each parsed with
``json``'s own decoder, so memory holds one element at a time, never the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

from core.errors import ValidationFailed

READ_CHARS = 1 << 20
# One element larger than this cannot be one memory, note or agent we can
# take; refusing it bounds the memory a malformed file can make us use.
MAX_VALUE_CHARS = 64 * 1024 * 1024
_WHITESPACE = " \t\n\r"
_decoder = json.JSONDecoder()


class Events:
    """The top level of a JSON document, read lazily.

    ``items(name)`` yields ``(key, index, value, line)``: the elements of the
    top-level array (key None), or of each top-level member whose name is in
    ``name`` (an array), one by one; every other top-level member comes as
    ``(key, None, value, line)``, parsed whole.
    """

    def __init__(self, stream: IO[str], label: str) -> None:
        self.stream = stream
        self.label = label
        self.buf = ""
        self.pos = 0
        self.line = 1  # the line of self.pos
        self._counted = 0  # newlines are counted in buf up to here
        self.eof = False
        # The arrays met so far, empty ones too: None for a document that is one.
        self.found: set[str | None] = set()

    # reading ---------------------------------------------------------------

    def _more(self, chars: int | None = None) -> bool:
        if self.eof:
            return False
        chunk = self.stream.read(chars or READ_CHARS)
        if not chunk:
            self.eof = True
            return False
        # Drop what has been consumed, keeping line numbers right.
        self._advance_lines()
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        self._counted = 0
        return True

    def _advance_lines(self) -> None:
        if self.pos > self._counted:
            self.line += self.buf.count("\n", self._counted, self.pos)
            self._counted = self.pos

    def _skip_space(self) -> str:
        """Return the next significant character (not consuming it), or "" at the end."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WHITESPACE:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def _expect(self, allowed: str, what: str) -> str:
        char = self._skip_space()
        if not char or char not in allowed:
            found = f"{char!r}" if char else "the end of the file"
            raise self.error(f"expected {what}, found {found}")
        self.pos += 1
        return char

    def _value(self) -> Any:
        self._skip_space()
        self._advance_lines()
        want = READ_CHARS
        while True:
            try:
                value, end = _decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                # A value cut by the end of the buffer fails too: read on and
                # try again, unless the fault lies well before that end.
                genuine = exc.pos < len(self.buf) - 64 and not exc.msg.startswith(
                    "Unterminated string"
                )
                if genuine or len(self.buf) - self.pos > MAX_VALUE_CHARS or not self._more(want):
                    line = self.line + self.buf.count("\n", self.pos, min(exc.pos, len(self.buf)))
                    if len(self.buf) - self.pos > MAX_VALUE_CHARS:
                        raise ValidationFailed(
                            f"{self.label}, line {self.line}: a value larger than "
                            f"{MAX_VALUE_CHARS // (1024 * 1024)} MB, or JSON that does not end."
                        ) from None
                    raise ValidationFailed(
                        f"{self.label}, line {line}: not valid JSON ({_said(exc.msg)})."
                    ) from None
                want = min(want * 2, MAX_VALUE_CHARS)
                continue
            except RecursionError:
                raise self.error("JSON nested too deeply") from None
            except ValueError:
                # Python's own limit on an integer's digits (4,300): not a decode error.
                raise self.error("a number too long to read") from None
            # A number that runs to the end of the buffer ("12", "12.", "1e")
            # may continue in the next read.
            rest = self.buf[end:]
            number = isinstance(value, int | float) and not isinstance(value, bool)
            cut = number and not self.eof and len(rest) < 32 and not rest.strip("0123456789.eE+-")
            if cut and self._more(want):
                continue
            self.pos = end
            return value

    def error(self, message: str) -> ValidationFailed:
        self._advance_lines()
        return ValidationFailed(f"{self.label}, line {self.line}: {message}.")

    # the top level ----------------------------------------------------------

    def top(self) -> str:
        """Return "[" or "{": what the document is. Anything else is refused."""
        char = self._skip_space()
        if char not in ("[", "{"):
            found = f"{char!r}" if char else "nothing"
            raise self.error(f"expected a JSON array or object, found {found}")
        return char

    def items(self, arrays: frozenset[str] = frozenset()) -> Iterator[tuple[Any, Any, Any, int]]:
        if self.top() == "[":
            self.found.add(None)
            yield from self._array(None)
        else:
            self.pos += 1
            if self._skip_space() == "}":
                self.pos += 1
            else:
                while True:
                    self._advance_lines()
                    key = self._value()
                    if not isinstance(key, str):
                        raise self.error("expected a member name")
                    self._expect(":", "':'")
                    if key in arrays and self._skip_space() == "[":
                        self.found.add(key)
                        yield from self._array(key)
                    else:
                        line = self.line
                        yield key, None, self._value(), line
                    if self._expect(",}", "',' or '}'") == "}":
                        break
        if self._skip_space():
            raise self.error("unexpected text after the JSON document")

    def _array(self, key: str | None) -> Iterator[tuple[Any, Any, Any, int]]:
        self._expect("[", "'['")
        if self._skip_space() == "]":
            self.pos += 1
            return
        index = 0
        while True:
            self._skip_space()
            self._advance_lines()
            line = self.line
            yield key, index, self._value(), line
            index += 1
            if self._expect(",]", "',' or ']'") == "]":
                return


def _said(msg: str) -> str:
    """Return a decode error's message whole: some end in "at", before the place json adds."""
    if msg.startswith("Invalid control character"):
        return "a control character, such as NUL or a tab, not escaped in a string"
    if msg.startswith("Unterminated string"):
        return "a string with no closing quote"
    return msg.removesuffix(" at")

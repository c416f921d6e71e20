"""Cutting a document into chunks, one memory each: by its structure first, then by size.

A document is cut at Markdown headings into sections, each section into
paragraphs (blank lines), and paragraphs are packed into chunks of at most
``CHUNK_CHARS`` characters. A paragraph longer than that is cut at sentence
ends, and a sentence longer than that at whitespace. Each chunk remembers the
heading it sits under, so a search hit can say where in the document it is.

A chunk of headings alone ("# Runbook" above "## Deploy", or a heading whose
first paragraph did not fit beside it) says nothing as a memory of its own:
it opens the next chunk instead (the end of the last one, at the end of the
document), which may then pass the size by those headings' length: at most
the size again. A longer run of headings is a chunk of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CHUNK_CHARS = 1200
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


@dataclass(frozen=True)
class Chunk:
    text: str
    heading: str
    position: int


def chunk(document: str, size: int = CHUNK_CHARS) -> list[Chunk]:
    """Return the document's chunks in order; empty sections give none."""
    pieces = [
        (heading, text)
        for heading, body in _sections(document)
        for text in _pack(_paragraphs(body), size)
    ]
    chunks: list[Chunk] = []
    carried: list[tuple[str, str]] = []
    for heading, text in pieces:
        if _headings_only(text):
            # Carried up to the size, no further: a run of headings past it (a
            # document of headings alone) is its own chunk, not one without end.
            if carried and len(_joined(carried)) + 2 + len(text) > size:
                chunks.append(Chunk(_joined(carried), carried[0][0], len(chunks)))
                carried = []
            carried.append((heading, text))
            continue
        if carried:
            text = f"{_joined(carried)}\n\n{text}"
            carried = []
        chunks.append(Chunk(text=text, heading=heading, position=len(chunks)))
    if carried and chunks and len(chunks[-1].text) + 2 + len(_joined(carried)) <= 2 * size:
        last = chunks[-1]
        text = f"{last.text}\n\n{_joined(carried)}"
        chunks[-1] = Chunk(text=text, heading=last.heading, position=last.position)
    elif carried:  # a document of headings and nothing else, or too many to close the last
        chunks.append(Chunk(_joined(carried), carried[0][0], len(chunks)))
    return chunks


def _joined(carried: list[tuple[str, str]]) -> str:
    return "\n\n".join(lines for _, lines in carried)


def _headings_only(text: str) -> bool:
    return all(HEADING.match(line) for line in text.splitlines() if line.strip())


def _sections(document: str) -> list[tuple[str, str]]:
    sections: list[tuple[str, list[str]]] = [("", [])]
    fenced = False
    for line in document.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            sections.append((match.group(2).strip(), [line]))
        else:
            sections[-1][1].append(line)
    return [(heading, "\n".join(lines)) for heading, lines in sections]


def _paragraphs(body: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", body) if p.strip()]


def _pieces(paragraph: str, size: int) -> list[str]:
    if len(paragraph) <= size:
        return [paragraph]
    pieces: list[str] = []
    for sentence in SENTENCE_END.split(paragraph):
        while len(sentence) > size:
            cut = sentence.rfind(" ", 0, size)
            cut = cut if cut > size // 2 else size
            pieces.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            pieces.append(sentence)
    return pieces


def _pack(paragraphs: list[str], size: int) -> list[str]:
    packed: list[str] = []
    current = ""
    for paragraph in paragraphs:
        for index, piece in enumerate(_pieces(paragraph, size)):
            # A paragraph starts after a blank line, even when it is cut into
            # sentences; only its later sentences follow on the same line.
            joiner = "\n\n" if index == 0 else " "
            if current and len(current) + len(joiner) + len(piece) > size:
                packed.append(current)
                current = piece
            else:
                current = f"{current}{joiner}{piece}" if current else piece
    if current:
        packed.append(current)
    return packed

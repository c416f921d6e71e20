"""Cutting a document into chunks, one memory each: by its structure first, then by size.

A document is cut at Markdown headings into sections, each section into
paragraphs (blank lines), and paragraphs are packed into chunks of at most
``CHUNK_CHARS`` characters. A paragraph longer than that is cut at sentence
ends, and a sentence longer than that at whitespace. Each chunk remembers the
heading it sits under, so a search hit can say where in the document it is.
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
    chunks: list[Chunk] = []
    for heading, body in _sections(document):
        for text in _pack(_paragraphs(body), size):
            chunks.append(Chunk(text=text, heading=heading, position=len(chunks)))
    return chunks


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
        for piece in _pieces(paragraph, size):
            joiner = "\n\n" if current and piece is paragraph else " "
            if current and len(current) + len(joiner) + len(piece) > size:
                packed.append(current)
                current = piece
            else:
                current = f"{current}{joiner}{piece}" if current else piece
    if current:
        packed.append(current)
    return packed

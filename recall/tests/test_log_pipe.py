"""The log handler drops lines, rather than wait, when nobody reads the stderr pipe."""

from __future__ import annotations

import json
import logging
import os
import select

import pytest

from core.logging import JsonFormatter, StderrHandler


@pytest.fixture
def pipe():
    read, write = os.pipe()
    stream = os.fdopen(write, "w")
    yield read, stream
    stream.close()
    os.close(read)


def record(message: str) -> logging.LogRecord:
    return logging.makeLogRecord({"name": "recall.test", "levelno": 20, "msg": message})


def drain(fd: int) -> bytes:
    out = b""
    while select.select([fd], [], [], 0)[0]:
        out += os.read(fd, 1 << 16)
    return out


def test_a_full_pipe_costs_lines_not_a_wait_and_the_loss_is_said(pipe):
    read, stream = pipe
    handler = StderrHandler(stream)
    handler.setFormatter(JsonFormatter())

    # The pipe holds 64 KiB; a blocking write would hang here for ever.
    for n in range(2000):
        handler.emit(record(f"call {n} " + "x" * 100))
    assert handler.dropped > 0
    lost = handler.dropped

    written = drain(read)
    handler.emit(record("after"))
    after = [json.loads(line) for line in drain(read).splitlines()]

    lines = [json.loads(line) for line in written.splitlines()]
    assert len(lines) + lost == 2000
    assert lines[0]["event"].startswith("call 0 ")
    assert after[0]["event"] == "log lines were dropped: stderr was not being read"
    assert after[0]["dropped"] == lost and after[0]["level"] == "warning"
    assert after[1]["event"] == "after"
    assert handler.dropped == 0


def test_a_line_cut_short_leaves_the_next_on_a_line_of_its_own(pipe):
    read, stream = pipe
    handler = StderrHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.emit(record("y" * (58 << 10)))  # 15 of the pipe's 16 pages

    handler.emit(record("z" * (16 << 10)))  # a page of it fits, then the pipe is full

    assert handler.dropped == 1
    assert drain(read).endswith(b"z" * 4096)
    handler.emit(record("next"))
    assert drain(read) == b"\nlog lines were dropped: stderr was not being read\nnext\n"


def test_a_terminal_or_a_file_is_written_as_by_a_stream_handler(tmp_path):
    with open(tmp_path / "log", "w") as stream:
        handler = StderrHandler(stream)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.emit(record("kept"))
    assert (tmp_path / "log").read_text() == "kept\n"

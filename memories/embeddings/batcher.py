"""Run concurrent single-text embeddings together, one model run at a time."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable

import numpy as np


class _Waiter:
    __slots__ = ("done", "error", "text", "vector")

    def __init__(self, text: str) -> None:
        self.text = text
        self.done = threading.Event()
        self.vector: np.ndarray | None = None
        self.error: BaseException | None = None


class Batcher:
    """Run concurrent single-text embeddings together, one model run at a time.

    Each request thread used to run the model itself: 16 worker threads,
    each asking onnxruntime for 2 intra-op threads on a 2-core machine. Here
    only one run is in flight at a time, with all the intra-op threads. A
    caller that finds the model free runs its text at once in its own thread,
    so a lone query pays no hand-off (going through another thread cost a
    lone query 2.8 ms, 30%, on the shared 2-core machine). Callers that find
    it busy queue their text; when the run ends, one thread takes everything
    queued (up to ``max_batch``), runs it as one batch and hands each caller
    its row. Errors reach every caller of the batch. That thread stops after
    ``idle_exit`` seconds without queued work and starts again when needed.
    """

    def __init__(
        self,
        run: Callable[[list[str]], np.ndarray],
        *,
        max_batch: int = 64,
        idle_exit: float = 30.0,
    ) -> None:
        self._run = run
        self.max_batch = max(1, max_batch)
        self.idle_exit = idle_exit
        self._ready = threading.Condition(threading.Lock())
        self._queue: list[_Waiter] = []
        self._busy = False  # a model run is in flight
        self._thread: threading.Thread | None = None
        self.runs = 0  # model runs, for tests and benchmarks

    def submit(self, text: str) -> np.ndarray:
        with self._ready:
            if not self._busy and not self._queue:
                self._busy = True
                waiter = None
            else:
                waiter = _Waiter(text)
                self._queue.append(waiter)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._serve, name="embedding-batcher", daemon=True
                    )
                    self._thread.start()
        if waiter is None:
            try:
                return self._run([text])[0]
            finally:
                self._done()
        waiter.done.wait()
        if waiter.error is not None:
            raise _own_copy(waiter.error) from waiter.error.__cause__
        assert waiter.vector is not None
        return waiter.vector

    def _done(self) -> None:
        with self._ready:
            self.runs += 1
            self._busy = False
            if self._queue:
                self._ready.notify()

    def _serve(self) -> None:
        while True:
            with self._ready:
                while self._busy or not self._queue:
                    if not self._ready.wait(self.idle_exit) and not self._queue:
                        self._thread = None
                        return
                self._busy = True
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
            try:
                vectors = self._run([waiter.text for waiter in batch])
                for waiter, vector in zip(batch, vectors, strict=True):
                    waiter.vector = vector
            except BaseException as exc:
                for waiter in batch:
                    waiter.error = exc
            finally:
                self._done()
                for waiter in batch:
                    waiter.done.set()


def _own_copy(error: BaseException) -> BaseException:
    """Return a copy of ``error`` for one caller to raise.

    One exception object raised in several threads at once would collect all
    their tracebacks.
    """
    try:
        return copy.copy(error).with_traceback(None)
    except Exception:
        return error

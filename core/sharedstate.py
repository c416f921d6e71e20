"""State shared by the worker processes of one ``recall serve --workers N``.

Without Redis, each process used to keep its own token buckets and its own
auth cache, so N workers admitted N allowances per key and saw a revoked key
only when their cache entry expired. The workers of one server share a small
file instead, mapped into each of them (``mmap``, ``MAP_SHARED``): the parent
creates it before starting the workers and names it in
``RECALL_WORKER_STATE``; each worker attaches to it on first use.

It holds two things:

* **Token buckets**, in a set-associative table: a key's 16-byte BLAKE2b
  digest picks one of ``BUCKETS`` sets of ``WAYS`` entries, and a check
  refills and takes a token inside that set. The digest is keyed with a
  random secret ``create()`` writes into the file's header: a client who
  could work out which bucket names share a set (its key's, and sign-in
  buckets for account names it chooses) could push its own spent bucket out
  at will and start again with a full one. A set is locked across processes
  with an ``fcntl`` record lock on its byte range (the kernel drops it if a
  worker dies holding it) and within a process with a thread lock, since
  record locks belong to processes, not threads. A new key takes a free entry,
  or one whose bucket has refilled (a full bucket is the same as none), or
  else the one closest to full: that key may then get through early, never
  be refused wrongly, exactly as the in-process limiter's ``max_keys``.
* **The auth version**, a counter ``bump_auth_version()`` increments when a
  key is revoked or changes tier; every worker compares it on each cached
  lookup and drops its auth cache when it moved.

Times are ``time.monotonic()``, one clock for every process on the machine.
``bench/ratelimit.py`` measures what a check costs.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ENV = "RECALL_WORKER_STATE"

MAGIC = b"RCLSTATE"
_HEADER = struct.Struct("<8sQII32s")  # magic, auth version, buckets, ways, placement secret
HEADER_SIZE = 64
_ENTRY = struct.Struct("<16sddd")  # key digest, tokens, updated, full_at
WAYS = 8
BUCKETS = 16_384  # 131,072 keys, 5 MiB
_EMPTY = bytes(16)
_VERSION_OFFSET = 8


class SharedState:
    """One mapping of the shared file. Use ``create()`` in the parent, ``attach()`` in workers."""

    def __init__(self, path: Path, fd: int, buckets: int, ways: int, secret: bytes) -> None:
        self.path = path
        self._fd = fd
        self.buckets = buckets
        self.ways = ways
        self._secret = secret
        self._set_size = _ENTRY.size * ways
        size = HEADER_SIZE + self._set_size * buckets
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._lock = threading.Lock()

    @classmethod
    def create(cls, directory: str | None = None, *, buckets: int = BUCKETS) -> SharedState:
        """Create a fresh, zeroed state file (in RAM-backed ``/dev/shm`` where there is one)."""
        if directory is None and Path("/dev/shm").is_dir():  # noqa: S108 - a tmpfs, by design
            directory = "/dev/shm"  # noqa: S108
        fd, name = tempfile.mkstemp(prefix="recall-state-", dir=directory)
        os.ftruncate(fd, HEADER_SIZE + _ENTRY.size * WAYS * buckets)
        secret = os.urandom(32)
        os.pwrite(fd, _HEADER.pack(MAGIC, 0, buckets, WAYS, secret), 0)
        return cls(Path(name), fd, buckets, WAYS, secret)

    @classmethod
    def attach(cls, path: str | Path) -> SharedState:
        fd = os.open(path, os.O_RDWR)
        header = os.pread(fd, _HEADER.size, 0)
        magic, _, buckets, ways, secret = _HEADER.unpack(header)
        if magic != MAGIC:
            os.close(fd)
            raise ValueError(f"{path} is not a Recall worker state file")
        return cls(Path(path), fd, buckets, ways, secret)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)

    def remove(self) -> None:
        """Close and delete the file (the parent, once its workers have stopped)."""
        self.close()
        self.path.unlink(missing_ok=True)

    # Token buckets -----------------------------------------------------------------

    def take(
        self,
        key: str,
        capacity: int,
        refill_per_s: float,
        epsilon: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> tuple[bool, float]:
        """Refill ``key``'s bucket and take one token if there is one: (allowed, tokens left)."""
        digest = self._digest(key)
        start = HEADER_SIZE + self._set(digest) * self._set_size
        with self._lock:
            fcntl.lockf(self._fd, fcntl.LOCK_EX, self._set_size, start)
            try:
                now = clock()  # read under the lock, so updates are in time order
                slot, tokens = self._find(digest, start, now, capacity, refill_per_s)
                allowed = tokens >= 1.0 - epsilon
                if allowed:
                    tokens = max(0.0, tokens - 1.0)
                full_at = now + (capacity - tokens) / refill_per_s
                _ENTRY.pack_into(self._map, slot, digest, tokens, now, full_at)
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, self._set_size, start)
        return allowed, tokens

    def set_index(self, key: str) -> int:
        """Return the set ``key``'s bucket is kept in, which differs from one file to the next."""
        return self._set(self._digest(key))

    def _digest(self, key: str) -> bytes:
        return hashlib.blake2b(key.encode(), digest_size=16, key=self._secret).digest()

    def _set(self, digest: bytes) -> int:
        return int.from_bytes(digest[:8], "little") % self.buckets

    def _find(
        self, digest: bytes, start: int, now: float, capacity: int, refill_per_s: float
    ) -> tuple[int, float]:
        """Return the entry for ``digest`` in the set at ``start`` and its refilled tokens."""
        spare = -1
        spare_full_at = float("inf")
        for way in range(self.ways):
            offset = start + way * _ENTRY.size
            held, tokens, updated, full_at = _ENTRY.unpack_from(self._map, offset)
            if held == digest:
                elapsed = max(0.0, now - updated)
                return offset, min(float(capacity), tokens + elapsed * refill_per_s)
            # A free entry, or a bucket that has refilled, is as good as none:
            # prefer those, then the one that will be full soonest.
            rank = -1.0 if held == _EMPTY or full_at <= now else full_at
            if rank < spare_full_at:
                spare, spare_full_at = offset, rank
        return spare, float(capacity)

    # Auth version -------------------------------------------------------------------

    def auth_version(self) -> int:
        # An aligned 8-byte read; a read that overlaps a write sees a value
        # other than the old one, which can only clear a cache once too often.
        return int.from_bytes(self._map[_VERSION_OFFSET : _VERSION_OFFSET + 8], "little")

    def bump_auth_version(self) -> None:
        with self._lock:
            fcntl.lockf(self._fd, fcntl.LOCK_EX, 8, _VERSION_OFFSET)
            try:
                version = self.auth_version() + 1
                self._map[_VERSION_OFFSET : _VERSION_OFFSET + 8] = version.to_bytes(8, "little")
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 8, _VERSION_OFFSET)


_state: SharedState | None = None
_state_lock = threading.Lock()


def get() -> SharedState | None:
    """Return this worker's mapping of the server's shared state, or None outside ``--workers``."""
    global _state
    if _state is not None:
        return _state
    path = os.environ.get(ENV)
    if not path:
        return None
    with _state_lock:
        if _state is None:
            _state = SharedState.attach(path)
        return _state


def reset() -> None:
    """Forget the mapping, so the next ``get()`` reads the environment again (tests)."""
    global _state
    with _state_lock:
        state, _state = _state, None
    if state is not None:
        state.close()

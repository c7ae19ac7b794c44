"""Adapters giving the Python peers one small synchronous interface for the benchmark.

Each adapter wraps one queue from PyPI as its users call it: a plain loop of
``put``/``get`` calls, a transaction or batch where the library offers one, its
default settings unless the class says otherwise. ``LEVEL`` and ``GUARANTEE``
say what the peer promises when the process is killed or the machine loses
power; the benchmark compares our rows with peers of at least the same level.

Levels: ``none`` (a kill loses or resurrects data), ``kill`` (nothing a
returned put stored is lost when the process is killed; power loss may lose
recent puts), ``durable`` (fsynced before put returns).

The same adapters serve the two-process benchmark (``bench/bench_roles.py``): ``prepare``
creates a queue once before a producer process and a consumer process ``attach`` to it,
and ``get_wait`` waits for a message the way a consumer in another process can.
"""

from __future__ import annotations

import base64
import importlib
import importlib.metadata
import multiprocessing
import os
import platform
import time
from typing import Any, ClassVar

START_METHOD = ("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                else "spawn")
"""How the two-process benchmark starts its processes (and makes a ``multiprocessing.Queue``):
a fork server, where there is one, starts them in milliseconds from a process that has
imported the libraries once; no process forks a parent that runs threads."""

POLL_SECONDS = 0.001
"""How long ``get_wait`` sleeps when a peer without a wake-up across processes is empty."""


class PeerEmpty(Exception):
    """The peer has no message to return."""


class Peer:
    """One open peer queue in ``directory``; subclasses fill in the class attributes."""

    NAME: ClassVar[str] = ""
    """System name shown in the table."""
    KEY: ClassVar[str] = ""
    """Short name for ``--systems``."""
    DIST: ClassVar[str] = ""
    """Distribution name on PyPI (for the version in the JSON meta)."""
    MODULE: ClassVar[str] = ""
    LEVEL: ClassVar[str] = "none"
    GUARANTEE: ClassVar[str] = ""
    THREADS: ClassVar[str | None] = None
    """How the many-producer rows run, or None when the peer is not thread-safe."""
    PUT_BATCH: ClassVar[str | None] = None
    """How ``put_batch`` stores a batch, or None when the peer has no batch put."""
    GET_BATCH: ClassVar[str | None] = None
    """How ``get_batch`` takes a batch, or None when the peer has no batch get."""
    STANDARD: ClassVar[bool] = True
    """Runs the non-durable workloads (put, put_many, drain, get_many)."""
    DURABLE: ClassVar[bool] = False
    """Runs the durable workloads (1, 16, 64 producers)."""

    def __init__(self, directory: str, *, threads: bool = False, batch: bool = False) -> None:
        self.directory = directory

    @classmethod
    def available(cls) -> bool:
        """True if the peer's package imports."""
        try:
            importlib.import_module(cls.MODULE)
        except ImportError:
            return False
        return True

    @classmethod
    def version(cls) -> str:
        """The installed version of the peer's distribution, or ``"missing"``."""
        try:
            return importlib.metadata.version(cls.DIST)
        except importlib.metadata.PackageNotFoundError:
            return "missing"

    def put(self, data: bytes) -> None:
        """Store one message."""
        raise NotImplementedError

    def put_batch(self, items: list[bytes]) -> None:
        """Store a batch of messages the way the library batches them."""
        raise NotImplementedError

    def get(self) -> bytes:
        """Take the oldest message.

        Raises PeerEmpty if there is none.
        """
        raise NotImplementedError

    def get_batch(self, n: int) -> list[bytes]:
        """Take up to ``n`` messages the way the library batches them."""
        raise NotImplementedError

    def get_wait(self) -> bytes:
        """Take the oldest message, waiting for one.

        The default polls ``get()``, sleeping ``POLL_SECONDS`` while the peer is empty:
        the SQLite peers have no wake-up that reaches another process (persist-queue's
        blocking ``get`` waits on an in-process event and polls only every 10 s).
        """
        while True:
            try:
                return self.get()
            except PeerEmpty:
                time.sleep(POLL_SECONDS)

    @classmethod
    def prepare(cls, directory: str) -> object:
        """Create the queue in ``directory`` once, before two processes open it.

        Returns what both processes need besides the directory (passed to ``attach``):
        None for a queue kept in files.
        """
        cls(directory).close()
        return None

    @classmethod
    def attach(cls, directory: str, shared: object) -> Peer:
        """Open the queue that ``prepare`` made, in a producer or a consumer process."""
        return cls(directory)

    def rest(self) -> list[bytes]:
        """Take every remaining message, untimed, to finish the benchmark's check.

        The default calls ``get()`` until the peer is empty; a peer whose
        ``get()`` slows down with depth may read the rest in the same order
        without consuming it.
        """
        out = []
        while True:
            try:
                out.append(self.get())
            except PeerEmpty:
                return out

    def close(self) -> None:
        """Release the peer's files, saving its state."""
        raise NotImplementedError


class QueuelibFifo(Peer):
    """queuelib ``FifoDiskQueue``: length-prefixed records, state saved only on close."""

    NAME = "queuelib FifoDiskQueue"
    KEY = "queuelib"
    DIST = "queuelib"
    MODULE = "queuelib"
    LEVEL = "none"
    GUARANTEE = "none: positions kept in memory until close(); a kill loses or resurrects data"
    PUT_BATCH = "push loop (no batch API)"
    GET_BATCH = "pop loop (no batch API)"

    def __init__(self, directory: str, *, threads: bool = False, batch: bool = False) -> None:
        from queuelib import FifoDiskQueue

        super().__init__(directory)
        self.q = FifoDiskQueue(os.path.join(directory, "q"))

    def put(self, data: bytes) -> None:
        self.q.push(data)

    def put_batch(self, items: list[bytes]) -> None:
        push = self.q.push
        for d in items:
            push(d)

    def get(self) -> bytes:
        d = self.q.pop()
        if d is None:
            raise PeerEmpty
        return d

    def get_batch(self, n: int) -> list[bytes]:
        pop = self.q.pop
        out = []
        for _ in range(n):
            d = pop()
            if d is None:
                break
            out.append(d)
        return out

    def close(self) -> None:
        self.q.close()


class PersistQueueFile(Peer):
    """persist-queue ``Queue``: pickled records in chunk files, an info file per put."""

    NAME = "persist-queue Queue"
    KEY = "persistqueue"
    DIST = "persist-queue"
    MODULE = "persistqueue"
    LEVEL = "kill"
    GUARANTEE = ("kill-safe: write+flush and info file renamed per put/get (autosave), "
                 "fsync only when a 100-item chunk rolls")
    THREADS = "OS threads sharing one Queue (its own lock)"

    def __init__(self, directory: str, *, threads: bool = False, batch: bool = False) -> None:
        import persistqueue

        super().__init__(directory)
        path = os.path.join(directory, "q")
        os.makedirs(path, exist_ok=True)
        # tempdir on the queue's filesystem, so its info file rename is atomic.
        self.q = persistqueue.Queue(path, autosave=True, tempdir=directory)

    def put(self, data: bytes) -> None:
        self.q.put(data)

    def get(self) -> bytes:
        import persistqueue

        try:
            d: bytes = self.q.get(block=False)
        except persistqueue.Empty:
            raise PeerEmpty from None
        return d

    def close(self) -> None:
        # persist-queue has no close(); its files are closed by __del__.
        self.q.headf.close()
        self.q.tailf.close()


class PersistQueueSQLite(Peer):
    """persist-queue ``SQLiteQueue``: one SQLite row per message, a commit per put."""

    NAME = "persist-queue SQLiteQueue"
    KEY = "persistqueue-sqlite"
    DIST = "persist-queue"
    MODULE = "persistqueue"
    LEVEL = "durable"
    GUARANTEE = "durable: SQLite WAL, synchronous=FULL (library default), one commit per put"
    THREADS = "OS threads sharing one SQLiteQueue(multithreading=True)"
    PUT_BATCH = "auto_commit=False, put x1000, task_done() commits"
    DURABLE = True

    def __init__(self, directory: str, *, threads: bool = False, batch: bool = False) -> None:
        import persistqueue

        super().__init__(directory)
        self.q = persistqueue.SQLiteQueue(os.path.join(directory, "q"), auto_commit=not batch,
                                          multithreading=threads)
        conn: Any = self.q._putter
        (mode,) = conn.execute("PRAGMA synchronous").fetchone()
        if mode < 2:  # not FULL: a commit is not fsynced
            raise RuntimeError(f"persist-queue SQLiteQueue runs with synchronous={mode}, "
                               "not FULL; the benchmark's guarantee text would be wrong")

    def put(self, data: bytes) -> None:
        self.q.put(data)

    def put_batch(self, items: list[bytes]) -> None:
        put = self.q.put
        for d in items:
            put(d)
        self.q.task_done()

    def get(self) -> bytes:
        import persistqueue

        try:
            d: bytes = self.q.get(block=False)
        except persistqueue.Empty:
            raise PeerEmpty from None
        return d

    def close(self) -> None:
        self.q.close()


class PersistQueueSQLiteAck(Peer):
    """persist-queue ``SQLiteAckQueue``: ``get()`` takes a message and acks it at once."""

    NAME = "persist-queue SQLiteAckQueue"
    KEY = "persistqueue-sqliteack"
    DIST = "persist-queue"
    MODULE = "persistqueue"
    LEVEL = "durable"
    GUARANTEE = ("durable: SQLite WAL, synchronous=FULL (library default), a commit per put, "
                 "per get (unack) and per ack; acked rows stay in the table (its default)")
    STANDARD = False

    def __init__(self, directory: str, *, threads: bool = False, batch: bool = False) -> None:
        import persistqueue

        super().__init__(directory)
        self.q = persistqueue.SQLiteAckQueue(os.path.join(directory, "q"))

    def put(self, data: bytes) -> None:
        self.q.put(data)

    def get(self) -> bytes:
        import persistqueue

        try:
            item: dict[str, Any] = self.q.get(block=False, raw=True)
        except persistqueue.Empty:
            raise PeerEmpty from None
        self.q.ack(id=item["pqid"])
        d: bytes = item["data"]
        return d

    def close(self) -> None:
        self.q.close()


def _litequeue_takes_str() -> bool:
    """True if the installed litequeue stores ``str`` messages only (0.10 and later)."""
    try:
        version = importlib.metadata.version("litequeue")
    except importlib.metadata.PackageNotFoundError:
        return False
    parts = []
    for p in version.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= (0, 10)


class LiteQueuePeer(Peer):
    """litequeue ``LiteQueue`` with its own settings (WAL, synchronous=NORMAL).

    litequeue 0.10 and later take ``str`` messages only: there the adapter stores each
    message base64-encoded (ASCII, 4/3 of the bytes) and says so in ``NAME``. Up to
    0.9, SQLite keeps the bytes as a BLOB.
    """

    STR_ONLY: ClassVar[bool] = _litequeue_takes_str()
    NAME = "litequeue" + (" (bytes as base64 str)" if STR_ONLY else "")
    KEY = "litequeue"
    DIST = "litequeue"
    MODULE = "litequeue"
    LEVEL = "kill"
    GUARANTEE = "kill-safe: SQLite WAL, synchronous=NORMAL (library default), commit per put"
    THREADS = "OS threads sharing one LiteQueue connection"
    PUT_BATCH: ClassVar[str | None] = "transaction() around put x1000"
    SYNCHRONOUS: ClassVar[str | None] = None

    def __init__(self, directory: str, *, threads: bool = False, batch: bool = False) -> None:
        from litequeue import LiteQueue  # type: ignore[import-untyped]

        super().__init__(directory)
        self.q = LiteQueue(os.path.join(directory, "q.sqlite3"))
        if self.SYNCHRONOUS is not None:
            self.q.conn.execute(f"PRAGMA synchronous = {self.SYNCHRONOUS};")

    def put(self, data: bytes) -> None:
        # litequeue up to 0.9 annotates str, but SQLite keeps bytes as a BLOB.
        self.q.put(base64.b64encode(data).decode("ascii") if self.STR_ONLY else data)

    def put_batch(self, items: list[bytes]) -> None:
        q = self.q
        with q.transaction():
            if self.STR_ONLY:
                for d in items:
                    q.put(base64.b64encode(d).decode("ascii"))
            else:
                for d in items:
                    q.put(d)

    def _decode(self, data: Any) -> bytes:
        return base64.b64decode(data) if self.STR_ONLY else bytes(data)

    def get(self) -> bytes:
        m: Any = self.q.pop()
        if m is None:
            raise PeerEmpty
        return self._decode(m.data)

    def rest(self) -> list[bytes]:
        # pop() sorts every ready row per call, so draining a deep queue is quadratic:
        # read the rest with the ORDER BY that pop() uses, in one query.
        rows = self.q.conn.execute(
            f"SELECT data FROM {self.q.table} WHERE status = 0 ORDER BY message_id").fetchall()
        return [self._decode(r[0]) for r in rows]

    def close(self) -> None:
        self.q.close()


class LiteQueueFull(LiteQueuePeer):
    """litequeue with ``PRAGMA synchronous = FULL`` set after opening: its durable mode."""

    NAME = "litequeue (synchronous=FULL)"
    KEY = "litequeue-full"
    LEVEL = "durable"
    GUARANTEE = "durable: SQLite WAL, synchronous=FULL (set by the benchmark), commit per put"
    PUT_BATCH = None
    SYNCHRONOUS = "FULL"
    STANDARD = False
    DURABLE = True


class DiskcacheDeque(Peer):
    """diskcache ``Deque`` with its default cache settings (WAL, synchronous=NORMAL)."""

    NAME = "diskcache Deque"
    KEY = "diskcache"
    DIST = "diskcache"
    MODULE = "diskcache"
    LEVEL = "kill"
    GUARANTEE = "kill-safe: SQLite WAL, synchronous=NORMAL (library default), commit per op"
    THREADS = "OS threads sharing one Deque (a connection per thread)"
    PUT_BATCH: ClassVar[str | None] = "transact() around extend(1000)"
    GET_BATCH: ClassVar[str | None] = "transact() around popleft x1000"
    SYNCHRONOUS: ClassVar[int] = 1

    def __init__(self, directory: str, *, threads: bool = False, batch: bool = False) -> None:
        import diskcache  # type: ignore[import-untyped]

        super().__init__(directory)
        cache = diskcache.Cache(os.path.join(directory, "q"), eviction_policy="none",
                                sqlite_synchronous=self.SYNCHRONOUS)
        self.q = diskcache.Deque.fromcache(cache)

    def put(self, data: bytes) -> None:
        self.q.append(data)

    def put_batch(self, items: list[bytes]) -> None:
        with self.q.transact():
            self.q.extend(items)

    def get(self) -> bytes:
        try:
            d: bytes = self.q.popleft()
        except IndexError:
            raise PeerEmpty from None
        return d

    def get_batch(self, n: int) -> list[bytes]:
        q = self.q
        out: list[bytes] = []
        with q.transact():
            for _ in range(n):
                try:
                    out.append(q.popleft())
                except IndexError:
                    break
        return out

    def close(self) -> None:
        self.q.cache.close()


class DiskcacheDequeFull(DiskcacheDeque):
    """diskcache ``Deque`` on a cache with ``sqlite_synchronous=2`` (FULL): its durable mode."""

    NAME = "diskcache Deque (synchronous=FULL)"
    KEY = "diskcache-full"
    LEVEL = "durable"
    GUARANTEE = "durable: SQLite WAL, sqlite_synchronous=2 (FULL, set by the benchmark)"
    PUT_BATCH = None
    GET_BATCH = None
    SYNCHRONOUS = 2
    STANDARD = False
    DURABLE = True


class MultiprocessingQueue(Peer):
    """``multiprocessing.Queue`` (``START_METHOD``'s context): pickled messages through a
    pipe, nothing stored. Only for the two-process benchmark: ``prepare`` makes the queue
    that both processes are started with."""

    NAME = "multiprocessing.Queue"
    KEY = "mp-queue"
    DIST = ""
    MODULE = "multiprocessing"
    LEVEL = "none"
    GUARANTEE = ("none: stores nothing; a pipe and a feeder thread, so a kill of either "
                 "process or a power cut loses every message in flight")
    STANDARD = False

    def __init__(self, directory: str, *, threads: bool = False, batch: bool = False,
                 queue: Any = None) -> None:
        super().__init__(directory)
        self.q: Any = (multiprocessing.get_context(START_METHOD).Queue() if queue is None
                       else queue)

    @classmethod
    def version(cls) -> str:
        """Python's version: the queue is part of the standard library."""
        return f"Python {platform.python_version()}"

    @classmethod
    def prepare(cls, directory: str) -> object:
        """A new queue: start both processes with ``START_METHOD``'s context."""
        return multiprocessing.get_context(START_METHOD).Queue()

    @classmethod
    def attach(cls, directory: str, shared: object) -> Peer:
        """The queue ``prepare`` made, as passed to this process."""
        return cls(directory, queue=shared)

    def put(self, data: bytes) -> None:
        self.q.put(data)

    def get(self) -> bytes:
        import queue

        try:
            d: bytes = self.q.get_nowait()
        except queue.Empty:
            raise PeerEmpty from None
        return d

    def get_wait(self) -> bytes:
        d: bytes = self.q.get()
        return d

    def close(self) -> None:
        # Waits until the feeder thread has written every put message to the pipe.
        self.q.close()
        self.q.join_thread()


PEERS: list[type[Peer]] = [
    QueuelibFifo,
    PersistQueueFile,
    PersistQueueSQLite,
    LiteQueuePeer,
    LiteQueueFull,
    DiskcacheDeque,
    DiskcacheDequeFull,
]

PROCESS_PEERS: list[type[Peer]] = [
    PersistQueueSQLite,
    PersistQueueSQLiteAck,
    LiteQueuePeer,
    DiskcacheDeque,
    MultiprocessingQueue,
]
"""The peers of the two-process benchmark (bench/bench_roles.py): each allows a producer
process and a consumer process on one queue; run with their library defaults."""

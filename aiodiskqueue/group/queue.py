"""The public queue group of bytes, :class:`QueueGroup`, a producer or a consumer of a group
of shards, and what it shares with :class:`~.ack.AckQueueGroup` (``_Group``)."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Any, Generic, TypeVar, final

from .._core.options import Options, check_name, number
from .._format.group import GroupLayout, group_layout, shard_name
from .._format.layout import Layout, fsync_dir
from .._format.roles import check_role, holder_pid
from ..ack import AckQueue, Message
from ..errors import DiskQueueError, QueueClosed, QueueLocked, RoleError, ShardDamaged
from ..queue import DiskQueue
from ._reader import GroupReader, ShardHooks
from ._setup import GroupLock, check_shard, finish_removals, prepare_group

_SETTLE_DEFAULT = 30.0

Q = TypeVar("Q", DiskQueue, AckQueue)
T = TypeVar("T", bytes, Message)


def _check_group_role(role: object) -> str:
    r = check_role(role)
    if r == "both":
        raise ValueError("a queue group is opened with role='producer' or 'consumer', "
                         "got 'both'")
    return r


def _check_retention(value: object) -> float | None:
    if value is None:
        return None
    return number("retention", value, positive=False)


class _Group(Generic[Q, T]):
    """What both group classes share: the life cycle, the producer's shard claim and the
    consumer's reader."""

    _kind = "QueueGroup"

    def __init__(self, directory: str | os.PathLike[str], name: str, role: str,
                 retention: float | None, settle_timeout: float, core: Options) -> None:
        self._lay: GroupLayout = group_layout(directory, check_name(name), core.file_mode,
                                              core.dir_mode)
        self._role = _check_group_role(role)
        self._retention = _check_retention(retention)
        self._settle_timeout = number("settle_timeout", settle_timeout, positive=False)
        self._core = core
        self._producer: Q | None = None
        self._shard = -1
        self._reader: GroupReader[Q, T] | None = None
        self._state = "new"

    # ------------------------------------------------------------------ to fill in

    async def _open_shard(self, path: str, role: str) -> Q:
        raise NotImplementedError

    def _hooks(self) -> ShardHooks[Q, T]:
        raise NotImplementedError

    # ------------------------------------------------------------------ life cycle

    async def _start(self) -> None:
        if self._state != "new":
            raise RuntimeError(f"{self._kind} {self._lay.name!r} was opened already")
        self._state = "opening"
        try:
            await asyncio.to_thread(prepare_group, self._lay, self._core)
            if self._role == "producer":
                await self._claim()
            else:
                self._reader = GroupReader(self._lay, self._hooks(), retention=self._retention,
                                           settle_timeout=self._settle_timeout)
                await self._reader.start()
        except BaseException:
            self._state = "closed"
            raise
        self._state = "open"

    async def _claim(self) -> None:
        """Hold the producer role of a shard: the first existing one whose producer is
        gone, else a new one numbered after every shard there is. Under the group lock:
        no consumer removes the shard meanwhile, no other producer makes the same one.

        Raises ShardDamaged if a shard is not a readable directory or a free one cannot
        be opened (as a consumer's first look does), DiskQueueError if a new one cannot
        be made.
        """
        lay = self._lay
        async with GroupLock(lay.lock_path, lay.file_mode).held():
            await asyncio.to_thread(finish_removals, lay)
            shards = lay.shards()
            # Every shard checked before any is opened: a damaged one changes nothing.
            present = {num: path for num, path in shards.items() if check_shard(path)}
            for num, path in present.items():
                if holder_pid(Layout(path, lay.name).role_path("producer")) is not None:
                    continue  # a live producer's: a probe, cheaper than an open that fails
                try:
                    self._producer = await self._open_shard(path, "producer")
                except QueueLocked:
                    continue
                except DiskQueueError as exc:
                    raise ShardDamaged(path, f"cannot be opened: {exc}") from exc
                self._shard = num
                return
            num = max(shards, default=-1) + 1
            self._producer = await self._open_shard(lay.shard_path(num), "producer")
            self._shard = num
            try:
                # The new shard's entry in the group directory, before any put into it
                # is acknowledged (with sync_every=1, fsynced).
                await asyncio.to_thread(fsync_dir, lay.path)
            except BaseException:
                await self._producer.aclose()
                self._producer = None
                raise

    async def __aenter__(self) -> Any:
        if self._state == "new":
            await self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the group object; idempotent.

        A producer closes its shard (writes and syncs what is pending, as
        ``DiskQueue.aclose()``); the shard stays for the consumers and for the next
        producer. A consumer stops taking, closes its shards (their read positions
        are stored; an AckQueueGroup's messages in flight are delivered again by the
        shard's next owner) and leaves the group, so that the others take its shards.
        The close runs to its end even if the caller is cancelled; a later call waits
        for it.
        """
        self._state = "closed"
        if self._producer is not None:
            await self._producer.aclose()
        if self._reader is not None:
            await self._reader.aclose()

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if getattr(self, "_state", None) == "open":
            _warn(f"unclosed {self!r}", ResourceWarning, source=self)

    def __repr__(self) -> str:
        where = (f"shard={self.shard!r}" if self._role == "producer"
                 else f"shards={self.shards!r}")
        return (f"<{self._kind} {self._lay.name!r} in {self._lay.directory!r} "
                f"role={self._role} state={self._state} {where}>")

    # ------------------------------------------------------------------ both sides

    def _the_producer(self, what: str) -> Q:
        if self._role != "producer":
            raise RoleError(self._role, what)
        if self._producer is None or self._state != "open":
            raise QueueClosed(f"{self._kind} {self._lay.name!r} is not open")
        return self._producer

    def _the_reader(self, what: str) -> GroupReader[Q, T]:
        if self._role != "consumer":
            raise RoleError(self._role, what)
        if self._reader is None:
            raise QueueClosed(f"{self._kind} {self._lay.name!r} is not open")
        return self._reader

    @property
    def name(self) -> str:
        """The group's name."""
        return self._lay.name

    @property
    def directory(self) -> str:
        """The directory holding the group's directory ``NAME.group``."""
        return self._lay.directory

    @property
    def path(self) -> str:
        """The group's directory, ``DIRECTORY/NAME.group``."""
        return self._lay.path

    @property
    def role(self) -> str:
        """``"producer"`` or ``"consumer"``."""
        return self._role

    @property
    def shard(self) -> str | None:
        """A producer's shard (its directory name inside the group); None before it is open
        and on a consumer."""
        return shard_name(self._shard) if self._shard >= 0 else None

    @property
    def shards(self) -> list[str]:
        """A consumer's shards (directory names), in the order takes visit them; on a
        producer its one shard."""
        if self._reader is not None:
            return self._reader.shard_names()
        return [shard_name(self._shard)] if self._shard >= 0 else []

    def qsize(self) -> int:
        """A consumer: the messages not yet taken of the shards it holds now (an
        AckQueueGroup: those ready, not in flight). A producer: its shard's depth, as its
        queue counts it (from the consumer's last stored position)."""
        if self._reader is not None:
            return self._reader.qsize()
        return self._producer.qsize() if self._producer is not None else 0

    def __len__(self) -> int:
        return self.qsize()

    def empty(self) -> bool:
        """True if ``qsize() == 0``."""
        return self.qsize() == 0

    async def sync(self) -> None:
        """A producer: fsync its shard and store its meta now (``DiskQueue.sync()``). A
        consumer: store the read positions of its shards now (an AckQueueGroup: commit).

        Raises QueueClosed if closed, DiskQueueError if a sync fails.
        """
        if self._role == "producer":
            await self._the_producer("sync()").sync()
            return
        await self._the_reader("sync()").sync()

    # ------------------------------------------------------------------ get side

    def get_nowait(self) -> T:
        """Take a message that is ready in one of this consumer's shards, the shards taking
        turns; FIFO within each shard.

        Raises QueueEmpty if none is ready, QueueClosed once closed, RoleError on a
        producer, ShardDamaged as :meth:`get` does.
        """
        return self._the_reader("get_nowait()").take()

    async def get(self) -> T:
        """Take the next message of this consumer's shards, waiting for one. Shards take
        turns, one message each, so a busy shard cannot starve the others; order is
        FIFO within a shard, none across shards. Cancelling it takes nothing.

        Raises QueueClosed once closed, RoleError on a producer, ShardDamaged (once,
        the shard's error as its cause) if a shard this consumer holds fails (a strict
        read meets corruption, its queue breaks on an I/O error): that shard is handed
        over and taken again by this consumer only after a minute; the others go on.
        """
        return await self._the_reader("get()").get()

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.get()
        except QueueClosed:
            raise StopAsyncIteration from None



@final
class QueueGroup(_Group[DiskQueue, bytes]):
    """One logical queue of bytes written by many producer processes, read by one or more
    consumer processes: a group of shards, each a queue with one producer.

    Use ``async with QueueGroup(directory, name, role) as g`` or
    ``g = await QueueGroup.open(directory, name, role, **options)``; the options are
    :class:`~aiodiskqueue.DiskQueue`'s, given to every shard.


    On disk the group is the directory ``DIRECTORY/NAME.group``: a meta file with the
    options every shard shares (``max_bytes_per_file``, ``min_msg_size``,
    ``max_msg_size``; a group opened with other values raises GroupOptionConflict),
    and the shards ``000000``, ``000001``, ...: each a plain queue ``NAME`` in its own
    directory, go-diskqueue's files, readable alone by a DiskQueue or go-diskqueue.

    ``role="producer"`` claims a shard of its own: the first whose producer is gone,
    else a new one; a restarted worker claims again, with no configuration per
    worker. ``role="consumer"`` reads the whole group: it holds the consumer role of
    its share of the shards (divided among the live consumers: 2, 1 and 1 of 4 for
    three), takes new shards while it runs, hands shards over when another consumer
    joins (after their read positions are stored) and takes over the shards of a consumer that died
    (within about a second: its locks go with its process). No message goes to two
    consumers. Order is FIFO within a shard, none across shards; shards take turns.

    ``retention`` (seconds, None: never): a consumer removes a shard it holds that has
    had no producer and nothing unread (and, for an AckQueueGroup, nothing in flight,
    deferred or dead-lettered) for that long, but never the highest-numbered shard (new
    shards are numbered after it: no number is used twice). ``settle_timeout``: how long a shard
    being handed over waits for its messages in flight to settle before it is
    closed (those still out are delivered again by the next owner).

    Raises TypeError or ValueError for a bad option or role (``"both"`` is refused).
    """

    _kind = "QueueGroup"

    def __init__(self, directory: str | os.PathLike[str], name: str, role: str = "producer",
                 *, retention: float | None = None, settle_timeout: float = _SETTLE_DEFAULT,
                 **options: Any) -> None:
        self._options = Options.from_keywords("QueueGroup", options)
        super().__init__(directory, name, role, retention, settle_timeout, self._options)

    @classmethod
    async def open(cls, directory: str | os.PathLike[str], name: str, role: str = "producer",
                   **options: Any) -> QueueGroup:
        """Open (creating if needed) group ``name`` in ``directory`` as ``role``.

        Raises GroupNameConflict if a plain queue ``name`` exists there,
        GroupFormatError if the group's meta is damaged or of another version,
        GroupOptionConflict if an option differs from the group's, ShardDamaged if a
        shard is not a readable directory or cannot be opened, DiskQueueError if the
        files cannot be made; nothing stored is changed by any of these.
        """
        g = cls(directory, name, role, **options)
        await g._start()
        return g

    async def __aenter__(self) -> QueueGroup:
        await super().__aenter__()
        return self

    async def _open_shard(self, path: str, role: str) -> DiskQueue:
        return await DiskQueue.open(path, self._lay.name, role=role, **self._options.keywords())

    def _hooks(self) -> ShardHooks[DiskQueue, bytes]:
        async def open_consumer(path: str) -> DiskQueue:
            return await self._open_shard(path, "consumer")

        return ShardHooks(open_consumer, DiskQueue.get_nowait, _nothing_in_flight, _keeps_nothing)

    # ------------------------------------------------------------------ put side

    async def put(self, item: bytes | bytearray | memoryview) -> None:
        """Put ``item`` at the end of this producer's shard (``DiskQueue.put()``: returns once
        written to the OS, or fsynced with ``sync_every=1``).

        Raises RoleError on a consumer, otherwise as ``DiskQueue.put()``.
        """
        await self._the_producer("put()").put(item)

    def put_nowait(self, item: bytes | bytearray | memoryview) -> None:
        """Accept ``item`` for this producer's shard without waiting (``DiskQueue.put_nowait()``).

        Raises RoleError on a consumer, otherwise as ``DiskQueue.put_nowait()``.
        """
        self._the_producer("put_nowait()").put_nowait(item)

    async def put_many(self, items: Iterable[bytes | bytearray | memoryview]) -> None:
        """Put every item, in order, as one batch into this producer's shard.

        Raises RoleError on a consumer, otherwise as ``DiskQueue.put_many()``.
        """
        await self._the_producer("put_many()").put_many(items)

    def full(self) -> bool:
        """A producer: its shard's ``full()`` (``maxsize > 0`` and ``qsize() >= maxsize``,
        counted from the consumer's last stored position). A consumer puts nothing:
        False."""
        return self._producer.full() if self._producer is not None else False

    @property
    def maxsize(self) -> int:
        """A producer: the bound on its shard's ``qsize()`` for ``put()`` (0: unbounded).
        A consumer: 0."""
        return self._producer.maxsize if self._producer is not None else 0

    @property
    def queue(self) -> DiskQueue:
        """A producer's shard queue (for ``statistics()`` and the like; do not close it).

        Raises RoleError on a consumer, QueueClosed unless open.
        """
        return self._the_producer("queue")


def _nothing_in_flight(q: DiskQueue) -> int:
    return 0


def _keeps_nothing(q: DiskQueue) -> bool:
    return False

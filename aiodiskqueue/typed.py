"""Typed payloads: :class:`TypedQueue` and :class:`SyncTypedQueue`, a serializer over a queue.

The core stays bytes in, bytes out; a typed queue wraps an open queue and a
:class:`~aiodiskqueue.serializers.Serializer`::

    from aiodiskqueue.serializers import JsonSerializer
    from aiodiskqueue.typed import TypedQueue

    async with await TypedQueue.open(directory, "events",
                                     JsonSerializer[dict[str, int]]()) as q:
        await q.put({"n": 1})
        item = await q.get()           # mypy: dict[str, int]

A value that cannot be serialized raises SerializationError before anything is
stored (``put_many``: before any of the batch is). A record that cannot be
deserialized raises DeserializationError naming the queue's segment file, the
record's byte offset and its ordinal; that record has been taken out of the queue
(it is in the error's ``payload``, to keep or dead-letter), the following messages
are untouched, and the next ``get()`` returns the next one. ``get_many`` returns
the good messages taken before a bad one and raises the error at the next call.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterable, Iterator
from types import TracebackType
from typing import Any, Generic, TypeVar, final

from ._core.options import Statistics, check_max_items
from ._format.codec import HEADER_SIZE
from ._format.layout import Layout
from .errors import QueueClosed, QueueEmpty
from .queue import DiskQueue
from .serializers import DeserializationError, SerializationError, Serializer
from .sync import SyncDiskQueue
from .sync._base import Empty, _check_timeout, _get_within

__all__ = ["SyncTypedQueue", "TypedQueue"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def _dumps(serializer: Serializer[T], value: T) -> bytes:
    try:
        data = serializer.dumps(value)
    except Exception as exc:
        raise SerializationError(value, f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SerializationError(value, f"{type(serializer).__name__}.dumps returned "
                                 f"{type(data).__name__}, not bytes")
    return bytes(data)


@final
class TypedQueue(Generic[T]):
    """A :class:`~aiodiskqueue.DiskQueue` of values of type ``T``, stored through ``serializer``.

    Wraps an open (or ``async with``-opened) queue; the wrapper owns nothing
    more than the queue does: ``aclose()`` closes the queue. Mirrors the queue's
    methods with ``T`` in place of bytes. Use it on the queue's event loop.
    """

    def __init__(self, queue: DiskQueue, serializer: Serializer[T]) -> None:
        self._q = queue
        self._ser = serializer
        self._pending: DeserializationError | None = None

    @classmethod
    async def open(cls, directory: str | os.PathLike[str], name: str,
                   serializer: Serializer[T], **options: Any) -> TypedQueue[T]:
        """Open queue ``name`` in ``directory`` (the DiskQueue options) and wrap it.

        Raises as :meth:`DiskQueue.open` does.
        """
        return cls(await DiskQueue.open(directory, name, **options), serializer)

    async def __aenter__(self) -> TypedQueue[T]:
        await self._q.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._q.aclose()

    async def aclose(self) -> None:
        """Close the queue (:meth:`DiskQueue.aclose`)."""
        await self._q.aclose()

    def __repr__(self) -> str:
        return f"<TypedQueue {type(self._ser).__name__} {self._q!r}>"

    @property
    def queue(self) -> DiskQueue:
        """The byte queue underneath."""
        return self._q

    @property
    def serializer(self) -> Serializer[T]:
        """The serializer."""
        return self._ser

    # ------------------------------------------------------------------ put

    async def put(self, item: T) -> None:
        """Serialize ``item`` and put it; returns once written, as :meth:`DiskQueue.put`.

        Raises SerializationError (nothing stored) if ``item`` cannot be
        serialized, otherwise as :meth:`DiskQueue.put`.
        """
        await self._q.put(_dumps(self._ser, item))

    def put_nowait(self, item: T) -> None:
        """Serialize ``item`` and accept it without waiting, as :meth:`DiskQueue.put_nowait`."""
        self._q.put_nowait(_dumps(self._ser, item))

    async def put_many(self, items: Iterable[T]) -> None:
        """Serialize every item, then put them as one batch; one bad item stores none."""
        ser = self._ser
        await self._q.put_many([_dumps(ser, it) for it in items])

    # ------------------------------------------------------------------ get

    def _decode(self, payload: bytes) -> T:
        """Deserialize a record just taken: no other take can have happened since."""
        try:
            return self._ser.loads(payload)
        except Exception as exc:
            # The consumer position is just past the record taken last, in its own
            # segment: the record starts its header and payload before it.
            st = self._q.statistics()
            err = DeserializationError(
                queue=self._q.name, directory=self._q.directory,
                path=Layout(self._q.directory, self._q.name).segment_path(st.read_file_num),
                offset=st.read_pos - HEADER_SIZE - len(payload), ordinal=st.gets, payload=payload,
                reason=f"{type(exc).__name__}: {exc}")
            log.error("%s", err)
            raise err from exc

    def _raise_pending(self) -> None:
        err = self._pending
        if err is not None:
            self._pending = None
            raise err

    async def get(self) -> T:
        """Take the oldest message and deserialize it, waiting for one as :meth:`DiskQueue.get`.

        Raises DeserializationError if the record cannot be deserialized (it was
        taken; the next call returns the next message), otherwise as
        :meth:`DiskQueue.get`.
        """
        self._raise_pending()
        return self._decode(await self._q.get())

    def get_nowait(self) -> T:
        """As :meth:`get` without waiting: raises QueueEmpty if no message is ready."""
        self._raise_pending()
        return self._decode(self._q.get_nowait())

    async def get_many(self, max_items: int) -> list[T]:
        """Between 1 and ``max_items`` messages, waiting for the first.

        A bad record after good ones ends the batch: the good ones are returned
        and the DeserializationError is raised by the next get call.

        Raises TypeError or ValueError for a bad ``max_items`` (as
        :meth:`DiskQueue.get_many`), otherwise as :meth:`get`.
        """
        check_max_items(max_items)
        out = [await self.get()]
        while len(out) < max_items:
            try:
                payload = self._q.get_nowait()
            except (QueueEmpty, QueueClosed):
                break
            try:
                out.append(self._decode(payload))
            except DeserializationError as err:
                self._pending = err
                break
        return out

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.get()
        except QueueClosed:
            raise StopAsyncIteration from None

    # ------------------------------------------------------------------ the rest

    def qsize(self) -> int:
        """As :meth:`DiskQueue.qsize`."""
        return self._q.qsize()

    def __len__(self) -> int:
        return self._q.qsize()

    def empty(self) -> bool:
        """As :meth:`DiskQueue.empty`."""
        return self._q.empty()

    def full(self) -> bool:
        """As :meth:`DiskQueue.full`."""
        return self._q.full()

    def shutdown(self, immediate: bool = False) -> None:
        """As :meth:`DiskQueue.shutdown`."""
        self._q.shutdown(immediate)

    async def sync(self) -> None:
        """As :meth:`DiskQueue.sync`."""
        await self._q.sync()

    def statistics(self) -> Statistics:
        """As :meth:`DiskQueue.statistics`."""
        return self._q.statistics()


@final
class SyncTypedQueue(Generic[T]):
    """A :class:`aiodiskqueue.sync.DiskQueue` of values of type ``T``, for threads.

    Serializes in the calling thread (so a bad value raises before anything is
    sent), deserializes on the queue's loop right after the take (so the error
    names the record's file and offset as :class:`TypedQueue` does). ``close()``
    closes the facade.
    """

    def __init__(self, queue: SyncDiskQueue, serializer: Serializer[T]) -> None:
        self._sq = queue
        self._ser = serializer
        self._tq = TypedQueue(queue.queue, serializer)

    def __enter__(self) -> SyncTypedQueue[T]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._sq.close()

    def close(self) -> None:
        """Close the facade (:meth:`aiodiskqueue.sync.DiskQueue.close`)."""
        self._sq.close()

    def __repr__(self) -> str:
        return f"<SyncTypedQueue {type(self._ser).__name__} {self._sq!r}>"

    @property
    def queue(self) -> SyncDiskQueue:
        """The sync byte queue underneath."""
        return self._sq

    def put(self, item: T, block: bool = True, timeout: float | None = None) -> None:
        """Serialize ``item`` and put it, as :meth:`aiodiskqueue.sync.DiskQueue.put`.

        Raises SerializationError (nothing stored) if ``item`` cannot be serialized.
        """
        self._sq.put(_dumps(self._ser, item), block, timeout)

    def put_many(self, items: Iterable[T]) -> None:
        """Serialize every item, then put them as one batch; one bad item stores none."""
        ser = self._ser
        self._sq.put_many([_dumps(ser, it) for it in items])

    def get(self, block: bool = True, timeout: float | None = None) -> T:
        """Take and deserialize the oldest message, as :meth:`aiodiskqueue.sync.DiskQueue.get`.

        Raises Empty on timeout, DeserializationError as :meth:`TypedQueue.get`.
        """
        t = _check_timeout(timeout)
        tq = self._tq
        if not block:
            def take() -> T:
                try:
                    return tq.get_nowait()
                except Empty:
                    raise
                except QueueEmpty:
                    raise Empty("no message ready") from None

            return self._sq._peek(take)
        return self._sq._call(_get_within(tq.get, t))

    def get_many(self, max_items: int, timeout: float | None = None) -> list[T]:
        """As :meth:`TypedQueue.get_many`, waiting at most ``timeout`` for the first."""
        t = _check_timeout(timeout)
        tq = self._tq
        return self._sq._call(_get_within(lambda: tq.get_many(max_items), t))

    def __iter__(self) -> Iterator[T]:
        """Take messages until the queue is closed, or shut down and drained."""
        while True:
            try:
                yield self.get()
            except QueueClosed:
                return

    def qsize(self) -> int:
        """As :meth:`aiodiskqueue.sync.DiskQueue.qsize`."""
        return self._sq.qsize()

    def __len__(self) -> int:
        return self._sq.qsize()

    def empty(self) -> bool:
        """As :meth:`aiodiskqueue.sync.DiskQueue.empty`."""
        return self._sq.empty()

    def statistics(self) -> Statistics:
        """As :meth:`aiodiskqueue.sync.DiskQueue.statistics`."""
        return self._sq.statistics()

"""The facade of reliable delivery: :class:`AckQueue` (see the package's design notes in
:mod:`aiodiskqueue.ack`). It composes the delivery state and rules (:mod:`.dispatch`)
and the background work (:mod:`.pump`); the deadlines and the timer are
:mod:`.inflight`, one delivery :mod:`.message`."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, Literal, final

from .._core.options import DEFAULTS, check_max_items
from .._format import nsq
from .._format.layout import dead_letter_layout
from .._format.roles import check_role
from ..errors import DiskQueueError, MessageSizeError, QueueClosed, QueueEmpty, RoleError
from ..queue import DiskQueue
from .clock import Clock, LoopClock
from .codec import IdGenerator
from .dispatch import Dispatcher, QueueState
from .message import Message
from .options import ACK_DEFAULTS, AckOptions, AckStatistics, as_bytes, number
from .pump import Pump, PumpConfig

__all__ = ["AckQueue", "AckStatistics", "Message"]


_NO_SYNC_EVERY = 2**62  # the data queue stores its position only in our commits
_NO_SYNC_INTERVAL = 1e9


@final
class AckQueue:
    """A persistent queue with NSQ's at-least-once delivery, kept across a crash.

    ``get()`` hands out a :class:`Message` that is *in flight* until it is
    finished, requeued or touched; one not finished by its deadline
    (``msg_timeout``) is requeued automatically. ``put(body, delay=...)``
    publishes now or later (NSQ DPUB). Open with ``async with AckQueue(...)`` or
    ``await AckQueue.open(...)``.

    Durability: every message whose ``put()`` returned and that was not
    finished is delivered again after a crash (in-flight ones at once, deferred
    ones when due). A message finished before the last commit is not delivered
    again; with ``sync_every=1`` ``finish()`` returns only once durable.

    Options (keyword-only, checked at once): ``msg_timeout`` (> 0 s),
    ``max_msg_timeout`` (>= msg_timeout, cap for ``touch``), ``max_delay``
    (bound for put and requeue delays), ``max_in_flight`` (>= 1),
    ``max_attempts`` (0 = unlimited, else deliveries before dead-lettering to
    the queue ``NAME`` in the subdirectory ``NAME.dead-letters``), ``format``
    (``"raw"``: the payload is the body; ``"nsq"``: nsqd's message layout),
    ``clock`` (for tests), ``log_segment_bytes``, and
    every :class:`~aiodiskqueue.DiskQueue` option, with the same defaults, for
    the data queue (``sync_every`` and ``sync_interval`` set when commits happen;
    the dead-letter queue uses them as they are).

    ``role``: ``"both"`` (the default) is the whole queue in one object. A producer
    process and a consumer process may hold it at once (see
    :class:`~aiodiskqueue.DiskQueue`'s roles): ``"consumer"`` has the get side and
    everything of a delivery (in flight, finish, requeue, touch, timeouts, the ack log,
    the dead-letter queue, deferred puts, which go to the ack log); ``"producer"`` puts
    messages without a delay into the data queue, syncing as ``sync_every`` and
    ``sync_interval`` say, as a DiskQueue producer does. The other side's calls raise
    RoleError naming the role.

    Raises TypeError or ValueError for a bad option or role.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        name: str,
        role: str = "both",
        *,
        msg_timeout: float = ACK_DEFAULTS.msg_timeout,
        max_msg_timeout: float = ACK_DEFAULTS.max_msg_timeout,
        max_delay: float = ACK_DEFAULTS.max_delay,
        max_in_flight: int = ACK_DEFAULTS.max_in_flight,
        max_attempts: int = ACK_DEFAULTS.max_attempts,
        format: Literal["raw", "nsq"] = "raw",
        clock: Clock | None = None,
        log_segment_bytes: int = ACK_DEFAULTS.log_segment_bytes,
        max_bytes_per_file: int = DEFAULTS.max_bytes_per_file,
        min_msg_size: int = DEFAULTS.min_msg_size,
        max_msg_size: int = DEFAULTS.max_msg_size,
        sync_every: int = DEFAULTS.sync_every,
        sync_interval: float = DEFAULTS.sync_interval,
        maxsize: int = DEFAULTS.maxsize,
        read_buffer_bytes: int = DEFAULTS.read_buffer_bytes,
        write_buffer_bytes: int = DEFAULTS.write_buffer_bytes,
        strict: bool = DEFAULTS.strict,
        spin_us: int = DEFAULTS.spin_us,
        inline_writes: bool = DEFAULTS.inline_writes,
        file_mode: int = DEFAULTS.file_mode,
        dir_mode: int = DEFAULTS.dir_mode,
    ) -> None:
        # Every keyword parameter but clock is a field of AckOptions or Options
        # (tests/test_options_one_definition.py keeps them equal): checked there, and
        # the data and dead-letter queues' options derived from them.
        options = {k: v for k, v in locals().items() if k in AckOptions.NAMES}
        self._name = name
        self._directory = os.fspath(directory)
        o = AckOptions.from_keywords("AckQueue", options)
        self._role = check_role(role)
        self._msg_timeout = o.msg_timeout
        self._max_msg_timeout = o.max_msg_timeout
        self._nsq = o.nsq
        self._format = o.format
        self._sync_every = o.core.sync_every
        self._min_size = o.min_size
        self._max_size = o.core.max_msg_size
        # The data queue stores its position only in commits; the dead-letter queue syncs
        # as configured, unbounded. A producer has no commits (no ack log): its data queue
        # syncs as configured too.
        self._data = DiskQueue._with_options(
            directory, name, o.data_options() if role == "producer" else o.data_options(
                sync_every=_NO_SYNC_EVERY, sync_interval=_NO_SYNC_INTERVAL), role)
        self._dead_q: DiskQueue | None = None
        if o.max_attempts and role != "producer":
            dead = dead_letter_layout(self._directory, name, o.core.file_mode, o.core.dir_mode)
            self._dead_q = DiskQueue._with_options(dead.directory, dead.name,
                                                   o.data_options(maxsize=0))
        self._clock_arg = clock
        self._ids = IdGenerator()
        self._pump = Pump(PumpConfig(name=name, directory=self._directory,
                                     segment_bytes=o.log_segment_bytes,
                                     reserve_bytes=o.log_reserve_bytes,
                                     sync_every=o.core.sync_every,
                                     sync_interval=float(o.core.sync_interval), nsq=o.nsq,
                                     file_mode=o.core.file_mode, dir_mode=o.core.dir_mode),
                          self._data, self._dead_q)
        self._dispatcher = d = Dispatcher(name, self._data, self._pump, self._ids,
                                          nsq=o.nsq, max_in_flight=o.max_in_flight,
                                          max_attempts=o.max_attempts,
                                          max_delay=o.max_delay,
                                          max_msg_timeout=o.max_msg_timeout,
                                          sync_every=o.core.sync_every)
        # Bound once: the per-message paths call them without a lookup through _dispatcher.
        self._try_take = d.try_take
        self._take_ready = d.take_ready
        self._check_delay = d.check_delay
        self._check_open = d.check_open
        if role == "producer":
            # The get side is the consumer's: every delivery path starts with one of these.
            self._try_take = _refuse_take
            self._take_ready = _refuse_take_many

    # ------------------------------------------------------------------ life cycle

    @classmethod
    async def open(cls, directory: str | os.PathLike[str], name: str,
                   **options: Any) -> AckQueue:
        """Open (creating if needed) the queue ``name`` in ``directory``.

        Raises QueueLocked if it is open elsewhere (with a ``role``: if that role is
        held, or the whole queue), QueueNotFound for a consumer of a queue that does not
        exist, OptionConflict if an option contradicts the other role's, DiskQueueError
        on I/O errors, TypeError or ValueError for a bad option.
        """
        q = cls(directory, name, **options)
        await q._start()
        return q

    async def __aenter__(self) -> AckQueue:
        if self._dispatcher.state is QueueState.NEW:
            await self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def _start(self, after_recovery: Callable[[Dispatcher, Pump], Awaitable[None]]
                     | None = None) -> None:
        """Open the files and recover; ``after_recovery`` runs before the first commit."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._clock: Clock = self._clock_arg or LoopClock(loop)
        d, pump = self._dispatcher, self._pump
        if self._role == "producer":
            try:
                await self._data.__aenter__()
            except BaseException:
                d.closed()
                raise
            d.open()
            return
        try:
            journal, fetch_seq = await pump.open(d, loop)
            d.start(loop, self._clock, journal, fetch_seq)
            d.open()
            if after_recovery is not None:
                await after_recovery(d, pump)
            await pump.commit_now()
        except BaseException:
            d.closed()
            await pump.close_stores()
            raise
        d.inflight.arm()
        pump.start()

    async def aclose(self) -> None:
        """Write and commit what is pending, close the files; idempotent.

        Messages still in flight stay in the log and are delivered again after
        the next open. Blocked ``get()`` calls raise QueueClosed.
        """
        d = self._dispatcher
        task = self._pump.task
        if self._role == "producer" and d.state is not QueueState.NEW:
            d.closing()
            try:
                await asyncio.shield(self._data.aclose())
            finally:
                d.closed()
            return
        if task is None:
            if d.state is QueueState.NEW:
                d.closed()
            return
        if d.state is QueueState.OPEN:
            d.closing()
            d.wake_all()
            self._pump.kick()
        await asyncio.shield(task)

    def __del__(self, _warn: Any = warnings.warn) -> None:
        d = getattr(self, "_dispatcher", None)
        if d is not None and d.state in (QueueState.OPEN, QueueState.CLOSING):
            _warn(f"unclosed {self!r}", ResourceWarning, source=self)

    def __repr__(self) -> str:
        d = self._dispatcher
        started = hasattr(d, "inflight")
        in_flight = len(d.inflight) if started else 0
        deferred = d.inflight.n_deferred if started else 0
        return (f"<AckQueue {self._name!r} in {self._directory!r} state={d.state.value} "
                f"depth={self.qsize() if d.state is QueueState.OPEN else '?'} "
                f"in_flight={in_flight} deferred={deferred}>")

    # ------------------------------------------------------------------ put

    async def put(self, body: bytes | bytearray | memoryview, *, delay: float = 0.0) -> None:
        """Publish ``body``; with ``delay > 0`` it is delivered no earlier than that (NSQ DPUB).

        Returns once the message is written to the OS (``sync_every=1``: once
        durable). A deferred message keeps its due time across a restart. If
        the call is cancelled the message may still be stored.

        Raises TypeError for a non-bytes body, ValueError for a delay outside
        ``[0, max_delay]``, MessageSizeError for a size out of bounds,
        QueueClosed if the queue is not open, DiskQueueError (chained to the
        OSError) if a write fails: a deferred message is then kept in memory and
        written by the next successful hop, so it may still be delivered.
        RoleError for a delay on a producer (the ack log is the consumer's) and for
        no delay on a consumer (ready messages are the producer's).
        """
        data = as_bytes(body)
        d = self._check_delay(delay)
        if self._role != "both":
            self._check_role_put(d)
        self._check_open()
        if d == 0.0:
            payload = nsq.encode(self._clock.time_ns(), 0, self._ids.next(), data) \
                if self._nsq else data
            await self._data.put(payload)
            if self._role == "producer":
                return  # its data queue syncs by itself: no commit to count towards
        else:
            self._check_size(data)
            await self._dispatcher.put_deferred([data], d)
        self._pump.count_op()
        if self._sync_every == 1:
            # A data record needs the data queue fsynced: a commit. A log entry
            # needs the log fsynced, nothing more.
            await (self._pump.wait_commit() if d == 0.0 else self._pump.wait_log_sync())

    async def put_many(self, bodies: Iterable[bytes | bytearray | memoryview], *,
                       delay: float = 0.0) -> None:
        """Publish every body, in order, as one batch (NSQ MPUB); all share ``delay``.

        Every body is checked first: if one is invalid, nothing is put.

        Raises as :meth:`put` does.
        """
        datas = [as_bytes(b) for b in bodies]
        d = self._check_delay(delay)
        if self._role != "both":
            self._check_role_put(d)
        self._check_open()
        for data in datas:
            self._check_size(data)
        if not datas:
            return
        if d == 0.0:
            if self._nsq:
                now = self._clock.time_ns()
                datas = [nsq.encode(now, 0, self._ids.next(), b) for b in datas]
            await self._data.put_many(datas)
            if self._role == "producer":
                return
        else:
            await self._dispatcher.put_deferred(datas, d)
        for _ in datas:
            self._pump.count_op()
        if self._sync_every == 1:
            await (self._pump.wait_commit() if d == 0.0 else self._pump.wait_log_sync())

    def _check_role_put(self, delay: float) -> None:
        """Raise RoleError unless this role makes a put with ``delay``: the producer
        puts ready messages, the consumer (the ack log's owner) deferred ones."""
        if self._role == "producer" and delay > 0.0:
            raise RoleError(self._role, "put() with a delay (a deferred message goes to "
                                        "the ack log, which the consumer role holds)")
        if self._role == "consumer" and delay == 0.0:
            raise RoleError(self._role, "put() without a delay (ready messages are put "
                                        "by the producer role; a consumer puts deferred "
                                        "ones)")

    def _check_size(self, data: bytes) -> None:
        size = len(data) + (nsq.HEADER_SIZE if self._nsq else 0)
        if size < self._min_size or size > self._max_size:
            raise MessageSizeError(size, self._min_size, self._max_size)

    # ------------------------------------------------------------------ get

    def get_nowait(self, *, msg_timeout: float | None = None) -> Message:
        """Deliver a message that is ready in memory, without waiting.

        ``msg_timeout`` as for :meth:`get`.

        Raises QueueEmpty if none is ready or ``max_in_flight`` is reached,
        QueueClosed if the queue is not open, ValueError for a bad ``msg_timeout``.
        """
        m = self._try_take(self._check_timeout(msg_timeout))
        if m is None:
            raise QueueEmpty()
        return m

    async def get(self, *, msg_timeout: float | None = None) -> Message:
        """Deliver the next message; it is in flight until finished, requeued or timed out.

        ``msg_timeout`` overrides the queue's for this delivery and its touches
        (as a client's IDENTIFY ``msg_timeout`` does in nsqd); it must be > 0 and
        at most ``max_msg_timeout``. Waits while nothing is ready or
        ``max_in_flight`` messages are out. Cancelling ``get()`` leaves the
        queue unchanged.

        Raises QueueClosed when the queue is closed, ValueError for a bad
        ``msg_timeout``, RoleError on a producer.
        """
        timeout = self._check_timeout(msg_timeout)
        while True:
            m = self._try_take(timeout)
            if m is not None:
                return m
            await self._dispatcher.wait_for_message()

    async def get_many(self, max_items: int, *, msg_timeout: float | None = None
                       ) -> list[Message]:
        """Deliver between 1 and ``max_items`` messages, waiting for the first one only.

        Raises TypeError or ValueError unless ``max_items`` is an int >= 1, otherwise as
        :meth:`get`.
        """
        check_max_items(max_items)
        out = [await self.get(msg_timeout=msg_timeout)]
        if max_items > 1:
            out += self._take_ready(max_items - 1, self._check_timeout(msg_timeout))
        return out

    def get_many_nowait(self, max_items: int, *, msg_timeout: float | None = None
                        ) -> list[Message]:
        """Deliver up to ``max_items`` messages that are ready in memory, without waiting.

        The same messages, in the same order, as that many :meth:`get_nowait`
        calls, in one step (a consumer that serves batches, as the broker's
        message pump does).

        Raises QueueEmpty if none is ready or ``max_in_flight`` is reached,
        TypeError or ValueError unless ``max_items`` is an int >= 1, ValueError for a
        bad ``msg_timeout``, QueueClosed if the queue is not open.
        """
        check_max_items(max_items)
        out = self._take_ready(max_items, self._check_timeout(msg_timeout))
        if not out:
            raise QueueEmpty()
        return out

    def backoff(self, attempts: int) -> float:
        """The requeue delay of ``async with msg`` after a failure.

        1 s after the first attempt, doubling with each attempt, capped at ``max_delay``.
        """
        return self._dispatcher.backoff(attempts)

    def _check_timeout(self, msg_timeout: float | None) -> float:
        if msg_timeout is None:
            return self._msg_timeout
        t = number("msg_timeout", msg_timeout, positive=True)
        if t > self._max_msg_timeout:
            raise ValueError(f"msg_timeout must be <= max_msg_timeout={self._max_msg_timeout}, "
                             f"got {msg_timeout}")
        return t

    async def _wait_ready(self) -> None:
        """Wait until a ``get_nowait()`` may succeed, delivering nothing: for a reader that
        waits on several queues at once (a queue group's consumer). Cancelling it leaves
        the queue unchanged.

        Raises QueueClosed if the queue is not open, RoleError on a producer.
        """
        if self._role == "producer":
            raise RoleError(self._role, "get()")
        self._check_open()
        await self._dispatcher.wait_for_message()

    def __aiter__(self) -> AckQueue:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.get()
        except QueueClosed:
            raise StopAsyncIteration from None

    # ------------------------------------------------------------------ sync and purge

    async def sync(self) -> None:
        """Commit now: write and fsync the log, then sync the data queue.

        A producer has no log: it syncs its data queue (``DiskQueue.sync()``).

        Raises QueueClosed if the queue is not open, DiskQueueError if it fails.
        """
        if self._role == "producer":
            self._check_open()
            await self._data.sync()
            return
        await self._pump.wait_commit()

    async def purge(self) -> None:
        """Drop every message that is ready or deferred (nsqd's channel empty).

        Messages in flight stay in flight and can still be finished or
        requeued; messages on their way to the dead-letter queue go there.
        Puts that returned before the call are dropped, later ones are kept.
        The data queue's files are deleted (its ``purge()``).

        A consumer purges only while no other process holds the producer role.

        Raises RoleError on a producer (the ack log is the consumer's), or on a consumer
        while another process holds the producer role; QueueClosed if the queue is not
        open, DiskQueueError if a write fails.
        """
        if self._role == "producer":
            raise RoleError(self._role, "purge() (the ack log and the messages due again "
                                        "are the consumer's)")
        self._check_open()
        await self._pump.wait_purge()

    # ------------------------------------------------------------------ state and figures

    def qsize(self) -> int:
        """Messages ready to deliver: not in flight, not deferred (``len(q)`` too)."""
        return self._dispatcher.qsize()

    def __len__(self) -> int:
        return self.qsize()

    def empty(self) -> bool:
        """True if no message is ready to deliver (``qsize() == 0``), as asyncio.Queue.

        Messages in flight or deferred are not counted: see :meth:`statistics`.
        """
        return self.qsize() == 0

    @property
    def dead_letters(self) -> DiskQueue:
        """The dead-letter queue (``NAME`` in ``NAME.dead-letters/``), open while this
        queue is open.

        Raises RoleError on a producer (the dead letters are the consumer's),
        DiskQueueError if ``max_attempts`` is 0 (there is none).
        """
        if self._role == "producer":
            raise RoleError(self._role, "dead_letters (the dead-letter queue is the "
                                        "consumer's)")
        if self._dead_q is None:
            raise DiskQueueError(f"ack queue {self._name!r} has no dead-letter queue "
                                 "(max_attempts is 0)")
        return self._dead_q

    @property
    def role(self) -> str:
        """``"producer"``, ``"consumer"`` or ``"both"``."""
        return self._role

    @property
    def name(self) -> str:
        """The queue's name (the data queue's file name prefix)."""
        return self._name

    @property
    def directory(self) -> str:
        """The directory holding the queue's files."""
        return self._directory

    @property
    def format(self) -> str:
        """``"raw"`` or ``"nsq"``."""
        return self._format

    def statistics(self) -> AckStatistics:
        """A frozen snapshot of counters and sizes."""
        d = self._dispatcher
        j = getattr(d, "journal", None)
        inflight = getattr(d, "inflight", None)
        return AckStatistics(
            depth=self.qsize(),
            in_flight=len(inflight) if inflight is not None else 0,
            deferred=inflight.n_deferred if inflight is not None else 0,
            finished=d.finished,
            requeued=d.requeued,
            timed_out=d.timed_out,
            dead_lettered=self._pump.dead_lettered,
            delivered=d.delivered,
            commits=self._pump.commits,
            log_syncs=self._pump.log_syncs,
            log_bytes=j.bytes_on_disk() if j is not None else 0,
            log_segments=len(j.segs) if j is not None else 0,
            queue=self._data.statistics(),
        )


def _refuse_take(timeout: float) -> Message | None:
    """A producer's ``get()``, ``get_nowait()`` and ``async for``.

    Raises RoleError.
    """
    raise RoleError("producer", "get()")


def _refuse_take_many(limit: int, timeout: float) -> list[Message]:
    """A producer's ``get_many_nowait()``.

    Raises RoleError.
    """
    raise RoleError("producer", "get_many()")

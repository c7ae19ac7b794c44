"""The consumer side of a group: which shards this consumer holds, taking messages from
them in turn, handing shards over to other consumers, removing drained ones.

Each shard is a queue opened with ``role="consumer"``: its consumer role (a flock) is
what makes a shard this consumer's, so no message goes to two consumers. Every
consumer aims at its share (the shards divided among the live consumers, the
remainder one each to the first by member id): below it, it takes free
shards (a non-blocking try, so a shard held by another consumer is skipped); above it,
it stops taking from the highest-numbered ones, lets their in-flight messages settle
(bounded) and closes them, which stores their read positions first. A consumer that
dies drops its flocks with its process; the others see its member file closed (an
inotify event in the group directory, or the once-a-second look) and take its shards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from .._core.notify import DIR_CHANGES, FileWatch
from .._format.group import GroupLayout
from .._format.layout import Layout, fsync_dir
from .._format.lock import RoleLock
from .._format.meta import load_meta
from .._format.roles import holder_pid
from ..errors import (
    DiskQueueError,
    QueueClosed,
    QueueEmpty,
    QueueLocked,
    QueueNotFound,
    ShardDamaged,
)
from ._members import Membership
from ._setup import GroupLock, check_shard, finish_removals

log = logging.getLogger("aiodiskqueue.group")

_SETTLE_POLL = 0.05
_FAILED_RETRY = 60.0  # seconds before a consumer takes again a shard that failed in its hands


class ShardQueue(Protocol):
    """What the reader needs of a shard's queue (a DiskQueue or AckQueue consumer)."""

    async def _wait_ready(self) -> None: ...

    def qsize(self) -> int: ...

    async def sync(self) -> None: ...

    async def aclose(self) -> None: ...


Q = TypeVar("Q", bound=ShardQueue)
T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Owned(Generic[Q]):
    """A shard whose consumer role this reader holds."""

    num: int
    path: str
    q: Q
    idle_since: float
    releasing: bool = False  # no more takes: being handed over or removed


@dataclass(frozen=True, slots=True)
class ShardHooks(Generic[Q, T]):
    """How the reader opens and uses one kind of shard queue."""

    open: Callable[[str], Awaitable[Q]]
    """Open the shard queue in the given directory as its consumer."""
    take: Callable[[Q], T]
    """``get_nowait()``: raises QueueEmpty when nothing is ready."""
    in_flight: Callable[[Q], int]
    """Deliveries not yet settled (0 for a plain queue)."""
    kept: Callable[[Q], bool]
    """State that must outlive the shard besides its depth (deferred messages, dead
    letters): such a shard is never removed."""


class GroupReader(Generic[Q, T]):
    """The shards one consumer object holds, and the fair take over them."""

    def __init__(self, lay: GroupLayout, hooks: ShardHooks[Q, T], *,
                 retention: float | None, settle_timeout: float) -> None:
        self.lay = lay
        self.hooks = hooks
        self.retention = retention
        self.settle_timeout = settle_timeout
        self.owned: dict[int, Owned[Q]] = {}
        self._order: list[Owned[Q]] = []  # the shards takes come from, by number
        self._next = 0  # index in _order where the next take starts (round robin)
        self.members = Membership(lay)
        self._lock = GroupLock(lay.lock_path, lay.file_mode)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Future[None] | None = None
        self._watch: FileWatch | None = None
        self._task: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Task[None]] = set()
        self._failed: dict[int, float] = {}  # shard number: when this reader may take it again
        self.closing = False
        self._closed: asyncio.Task[None] | None = None  # the close, once begun
        self.removed = 0  # shards removed by retention

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        """Join the group, take this consumer's share of the shards, start watching.

        Raises ShardDamaged if a shard is not a readable directory or its queue cannot
        be opened; DiskQueueError if the group directory cannot be written.
        """
        self._loop = loop = asyncio.get_running_loop()
        self._changed = loop.create_future()
        await asyncio.to_thread(self.members.join)
        try:
            async with self._lock.held():
                await asyncio.to_thread(finish_removals, self.lay)
            self._watch = FileWatch(loop, self.lay.path, mask=DIR_CHANGES)
            await self.rebalance(strict=True)
        except BaseException:
            await self._close_shards()
            raise
        self._task = loop.create_task(self._run(), name=f"aiodiskqueue-group-{self.lay.name}")

    async def aclose(self) -> None:
        """Stop taking, close every shard (storing its read position), leave the group;
        idempotent. The close runs to its end even if the caller is cancelled; a later
        call waits for it."""
        if self._closed is None:
            assert self._loop is not None
            self.closing = True
            self._notify()
            if self._watch is not None:
                self._watch.close()  # wakes the watcher task, which then ends
            self._closed = self._loop.create_task(self._close())
        await asyncio.shield(self._closed)

    async def _close(self) -> None:
        if self._task is not None:
            await asyncio.wait([self._task])  # whatever it ended with, the shards close
        if self._releases:
            await asyncio.wait(list(self._releases))
        await self._close_shards()

    async def _close_shards(self) -> None:
        for o in list(self.owned.values()):
            await self._drop(o)
        if self._watch is not None:
            self._watch.close()
        self.members.leave()

    async def _run(self) -> None:
        assert self._watch is not None
        while not self.closing:
            await self._watch.wait()
            if self.closing:
                return
            try:
                await self.rebalance()
            except Exception:
                log.exception("%s: rebalancing the group's shards failed", self.lay.path)

    # ------------------------------------------------------------------ shards held

    async def rebalance(self, strict: bool = False) -> None:
        """Look at the group: drop shards removed by hand, release shards above this
        consumer's share, take free ones up to it, remove expired ones.

        ``strict`` (the first look, while opening): a damaged shard raises ShardDamaged;
        later it is logged and skipped.
        """
        loop = self._loop
        assert loop is not None
        shards = self.lay.shards()
        if strict:
            for path in shards.values():
                check_shard(path)  # before any shard is opened: nothing is touched
        for o in list(self.owned.values()):
            if o.num not in shards and not o.releasing:
                log.error("%s: shard removed while this consumer held it", o.path)
                await self._drop(o)
        share = await asyncio.to_thread(self.members.share, len(shards))
        active = [o for o in self.owned.values() if not o.releasing]
        if len(active) > share:
            for o in sorted(active, key=lambda o: o.num)[share:]:
                self._release_later(o)
        elif len(active) < share:
            now = loop.time()
            free = [n for n in shards if n not in self.owned and self._failed.get(n, 0) <= now]
            # Consumers joining at once start at different shards, not all at the first.
            at = int(self.members.id, 16) % len(free) if free else 0
            for num in free[at:] + free[:at]:
                if len(active) >= share or self.closing:
                    break
                got = await self._try_take_shard(num, shards[num], strict)
                if got is not None:
                    active.append(got)
        if self.retention is not None:
            await self._expire(self.retention)

    async def _try_take_shard(self, num: int, path: str, strict: bool) -> Owned[Q] | None:
        assert self._loop is not None
        try:
            if not check_shard(path):
                return None  # removed since it was listed
            if holder_pid(Layout(path, self.lay.name).role_path("consumer")) is not None:
                return None  # another consumer's: a probe, cheaper than an open that fails
            try:
                q = await self.hooks.open(path)
            except (QueueLocked, QueueNotFound):
                return None  # another consumer's, or a producer still creating it
            except DiskQueueError as exc:
                raise ShardDamaged(path, f"cannot be opened: {exc}") from exc
        except ShardDamaged as exc:
            if strict:
                raise
            # Looked at again only after a while: not a log line at every look.
            log.error("%s; skipped for %s s", exc, _FAILED_RETRY)
            self._failed[num] = self._loop.time() + _FAILED_RETRY
            return None
        o = Owned(num, path, q, self._loop.time())
        self.owned[num] = o
        self._reorder()
        if self.closing:
            await self._drop(o)
            return None
        return o

    def _release_later(self, o: Owned[Q]) -> None:
        assert self._loop is not None
        o.releasing = True
        self._reorder()
        task = self._loop.create_task(self._release(o))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, o: Owned[Q]) -> None:
        """Hand shard ``o`` over: no more takes from it (done), its in-flight messages
        settle (at most ``settle_timeout``), then it is closed, which commits (a finish
        still waiting for its commit returns once it is made) and stores its read
        position before the role is free."""
        loop = self._loop
        assert loop is not None
        deadline = loop.time() + self.settle_timeout
        while (self.hooks.in_flight(o.q) and loop.time() < deadline and not self.closing):
            await asyncio.sleep(_SETTLE_POLL)
        await self._drop(o)
        with contextlib.suppress(OSError):
            self.members.poke()

    async def _drop(self, o: Owned[Q]) -> None:
        if self.owned.get(o.num) is o:
            del self.owned[o.num]
        o.releasing = True
        self._reorder()
        try:
            await o.q.aclose()
        except Exception:
            log.exception("%s: closing the shard failed", o.path)

    def _reorder(self) -> None:
        self._order = sorted((o for o in self.owned.values() if not o.releasing),
                             key=lambda o: o.num)
        self._next = 0 if not self._order else self._next % len(self._order)
        self._notify()

    def _notify(self) -> None:
        """Wake every get() waiting: the shards changed, or the reader is closing."""
        fut = self._changed
        if self._loop is not None and not self.closing:
            self._changed = self._loop.create_future()
        if fut is not None and not fut.done():
            fut.set_result(None)

    # ------------------------------------------------------------------ retention

    async def _expire(self, retention: float) -> None:
        assert self._loop is not None
        # The highest-numbered shard stays: a new shard is numbered after it, so no
        # number is ever used twice (a reader that kept a shard's position by its name,
        # as a Spark checkpoint does, never meets a new queue under an old name).
        last = max(self.lay.shards(), default=-1)
        for o in list(self._order):
            now = self._loop.time()
            lay = Layout(o.path, self.lay.name)
            if (o.num >= last or o.q.qsize() or self.hooks.in_flight(o.q)
                    or self.hooks.kept(o.q) or holder_pid(lay.role_path("producer")) is not None):
                o.idle_since = now
            elif now - o.idle_since >= retention and not self.closing:
                await self._remove(o)

    async def _remove(self, o: Owned[Q]) -> None:
        """Remove drained shard ``o``, holding the group lock (no producer claims it
        meanwhile) and both its roles (nobody else opens it); the queue is closed first
        and its stored meta must say it is empty. Then it is renamed out of the group
        (readers no longer see it) and deleted."""
        lay = Layout(o.path, self.lay.name)
        o.releasing = True
        self._reorder()
        async with self._lock.held():
            producer = RoleLock(lay.lock_path, lay.role_path("producer"))
            try:
                producer.acquire()
            except (QueueLocked, OSError):
                o.releasing = False  # a producer came back: keep the shard
                self._reorder()
                return
            try:
                await self._drop(o)
                gone = await asyncio.to_thread(self._remove_locked, o.num, lay)
            finally:
                producer.release()
            if gone is not None:
                await asyncio.to_thread(_rmtree, gone)
                self.removed += 1
                log.info("%s: removed drained shard (retention %s s)", o.path, self.retention)

    def _remove_locked(self, num: int, lay: Layout) -> str | None:
        consumer = RoleLock(lay.lock_path, lay.role_path("consumer"))
        try:
            consumer.acquire()
        except QueueLocked:
            return None  # another consumer took it after the close
        try:
            meta = load_meta(lay.meta_path)
            if meta is not None and (meta.depth or meta.read != meta.write):
                log.warning("%s: not removed: its meta still holds %d messages",
                            lay.directory, meta.depth)
                return None
            dst = self.lay.removing_path(num)
            os.rename(lay.directory, dst)
            fsync_dir(self.lay.path)
            return dst
        finally:
            consumer.release()

    # ------------------------------------------------------------------ taking

    def closed_error(self) -> QueueClosed:
        """The error of a take from a closed group."""
        return QueueClosed(f"queue group {self.lay.name!r} in {self.lay.directory!r} is closed")

    def take(self, take: Callable[[Q], T] | None = None) -> T:
        """The next message, the shards taking turns (one message each per turn, so a busy
        shard cannot starve the others; FIFO within a shard).

        Raises QueueEmpty if no shard has one ready, QueueClosed once closed,
        ShardDamaged (once) if a shard fails: see :meth:`_failed_shard`.
        """
        if self.closing:
            raise self.closed_error()
        order = self._order
        n = len(order)
        take = take or self.hooks.take
        start = self._next
        for i in range(n):
            k = (start + i) % n
            o = order[k]
            try:
                item = take(o.q)
            except QueueEmpty:
                continue
            except DiskQueueError as exc:
                raise self._failed_shard(o, exc) from exc
            self._next = k + 1
            return item
        raise QueueEmpty()

    def _failed_shard(self, o: Owned[Q], exc: DiskQueueError) -> ShardDamaged:
        """Shard ``o``'s queue raised ``exc`` (a strict read met corruption, the queue
        broke on an I/O error, it closed): one bad shard must not stop the others, so it
        leaves the turns and is closed like a shard handed over (a consumer below its
        share may take it), and this reader takes it again only after a while. The
        caller raises the returned error, once."""
        assert self._loop is not None
        log.error("%s: the shard failed; this consumer takes it again in %s s: %s",
                  o.path, _FAILED_RETRY, exc)
        self._failed[o.num] = self._loop.time() + _FAILED_RETRY
        self._release_later(o)
        return ShardDamaged(o.path, f"failed while this consumer held it: {exc}")

    async def wait(self) -> None:
        """Wait until some shard may have a message ready, the shards change, or the
        reader closes. Cancelling it takes nothing."""
        changed = self._changed
        assert changed is not None
        if self.closing:
            raise self.closed_error()
        waits = [asyncio.ensure_future(o.q._wait_ready()) for o in self._order]
        try:
            await asyncio.wait([*waits, changed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            if waits:
                # Reap them (their errors: a shard closed while waiting, seen again by
                # the next take), so that none is left pending.
                await asyncio.wait(waits)
                for w in waits:
                    if not w.cancelled():
                        w.exception()

    async def get(self, take: Callable[[Q], T] | None = None) -> T:
        """The next message, waiting for one. Cancelling it takes nothing.

        Raises QueueClosed once closed.
        """
        while True:
            try:
                return self.take(take)
            except QueueEmpty:
                pass
            await self.wait()

    async def sync(self) -> None:
        """Store the read positions of the shards this consumer takes from now.

        Raises QueueClosed once closed, DiskQueueError if a sync fails.
        """
        if self.closing:
            raise self.closed_error()
        await asyncio.gather(*(o.q.sync() for o in self._order))

    def qsize(self) -> int:
        """The sum of ``qsize()`` of the shards this consumer takes from (not those being
        released)."""
        return sum(o.q.qsize() for o in self._order)

    def shard_names(self) -> list[str]:
        """The directory names of the shards this consumer takes from, in order."""
        return [os.path.basename(o.path) for o in self._order]


def _rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)

"""What both sync facades share: the loop thread, running a call on the loop, the errors."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import queue as _stdqueue
import threading
import warnings
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, Generic, TypeVar

from .. import queue as _core_queue
from ..ack import queue as _ack_queue
from ..errors import (
    DiskQueueError,
    LoopThreadError,
    MissingExtra,
    QueueClosed,
    QueueEmpty,
    QueueFull,
)

__all__ = ["Empty", "Full", "LoopThreadError"]

log = logging.getLogger(__name__)

_R = TypeVar("_R")
_Q = TypeVar("_Q", bound=_core_queue.DiskQueue | _ack_queue.AckQueue)

# How often a bounded put(timeout=...) looks for room again: the core has no public
# "wait for room" call, so it polls, starting fast and backing off.
_ROOM_POLL_MIN = 0.0005
_ROOM_POLL_MAX = 0.02


class Empty(QueueEmpty, _stdqueue.Empty):
    """``get()`` timed out, or ``get(block=False)`` found nothing ready.

    Also a :class:`queue.Empty` and an :class:`aiodiskqueue.QueueEmpty`.
    """


class Full(QueueFull, _stdqueue.Full):
    """``put(block=False)`` / ``put_nowait()`` found no room, or ``put(timeout=...)`` timed out.

    Also a :class:`queue.Full` and an :class:`aiodiskqueue.QueueFull`.
    """


class _Waiter:
    """A thread waiting for its put: the lock is released by the loop when it is done."""

    __slots__ = ("error", "lock", "released")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.error: BaseException | None = None
        self.released = False

    def release(self, error: BaseException | None = None) -> None:
        """Let the thread go on, raising ``error`` if given; only the first call counts."""
        if not self.released:
            self.released = True
            self.error = error
            self.lock.release()


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or math.isnan(timeout):
        raise TypeError(f"timeout must be a number or None, got {timeout!r}")
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, got {timeout}")
    return float(timeout)


class _LoopThread:
    """An event loop running forever on a daemon thread the facade owns."""

    def __init__(self, name: str, use_uvloop: bool) -> None:
        if use_uvloop:
            try:
                import uvloop
            except ImportError as exc:
                raise MissingExtra(
                    'uvloop=True needs uvloop: pip install "asyncio-diskqueue[uvloop]"'
                ) from exc
            self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        else:
            self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=f"aiodiskqueue-sync-{name}",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            # As asyncio.run() ends: cancel what is left (their callers see QueueClosed).
            tasks = asyncio.all_tasks(loop)
            for t in tasks:
                t.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            asyncio.set_event_loop(None)
            loop.close()

    def stop(self) -> None:
        """Stop the loop and wait for the thread (not from the thread itself)."""
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # already closed
            pass
        if threading.current_thread() is not self.thread:
            self.thread.join()


class _Facade(Generic[_Q]):
    """What both facades share: the loop, the life cycle, and running a call on the loop."""

    _kind = "queue"

    def __init__(self, q: _Q, loop: asyncio.AbstractEventLoop, runner: _LoopThread | None,
                 ) -> None:
        self._q: _Q = q
        self._loop = loop
        self._runner = runner
        self._lock = threading.Lock()
        self._closed = False
        self._done = threading.Event()
        # Tasks of calls in progress (touched on the loop only), cancelled when an
        # attached facade detaches.
        self._tasks: set[asyncio.Task[Any]] = set()

    @classmethod
    def _start(cls, opener: Callable[[], Awaitable[_Q]], name: str,
               use_uvloop: bool) -> tuple[_Q, asyncio.AbstractEventLoop, _LoopThread]:
        runner = _LoopThread(name, use_uvloop)

        async def open_it() -> _Q:
            return await opener()

        try:
            q = asyncio.run_coroutine_threadsafe(open_it(), runner.loop).result()
        except BaseException:
            runner.stop()
            raise
        return q, runner.loop, runner

    @staticmethod
    def _attach_loop(loop: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop:
        if loop is not None:
            return loop
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            raise DiskQueueError("attach() needs the loop that runs the queue: pass loop=, "
                                 "or call it from a coroutine on that loop") from None

    # ------------------------------------------------------------------ running calls

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _call(self, coro: Coroutine[Any, Any, _R]) -> _R:
        """Run ``coro`` as a task on the queue's loop and return its result (blocking).

        The thread waits for the task's own outcome, never for a cancelled stand-in:
        a ``get()`` that took its message before a cancellation reached it still hands
        the message over (asyncio.run_coroutine_threadsafe would drop it when the
        waiting side cancels first).
        """
        if self._on_loop_thread():
            coro.close()
            raise LoopThreadError(f"blocking call on the event loop thread of {self!r}; "
                                  "use the async queue there")
        cf: concurrent.futures.Future[_R] = concurrent.futures.Future()
        holder: list[asyncio.Task[_R]] = []
        name = self._q.name

        def done(t: asyncio.Task[_R]) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                # Only close(), the end of the loop or an interrupt cancels a call.
                cf.set_exception(QueueClosed(f"{self._kind} {name!r} was closed during the "
                                             "call"))
            elif (exc := t.exception()) is not None:
                cf.set_exception(exc)
            else:
                cf.set_result(t.result())

        def start() -> None:
            task = self._loop.create_task(coro)
            holder.append(task)
            self._tasks.add(task)
            task.add_done_callback(done)

        with self._lock:
            if self._closed:
                coro.close()
                raise QueueClosed(f"{self._kind} {name!r} is closed (sync facade)")
            try:
                self._loop.call_soon_threadsafe(start)
            except RuntimeError:  # the loop is closed
                coro.close()
                raise QueueClosed(f"{self._kind} {name!r}: its event loop is closed") from None
        try:
            return cf.result()
        except BaseException:
            if not cf.done():
                # Interrupted here (KeyboardInterrupt in the main thread): cancel the
                # task. A get() cancelled while waiting takes nothing; one whose message
                # was taken in the same instant hands it to nobody, as in asyncio.
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(
                        lambda: holder[0].cancel() if holder else None)
            raise

    def _peek(self, fn: Callable[[], _R]) -> _R:
        """Run a quick synchronous read of the queue on its loop (or here, if on it)."""
        if self._on_loop_thread():
            return fn()

        async def run() -> _R:
            return fn()

        return self._call(run())

    # ------------------------------------------------------------------ life cycle

    def close(self) -> None:
        """Close the facade from any thread; idempotent.

        A facade that opened its queue closes it (pending writes are written and
        synced, as ``aclose()`` does) and stops its loop thread; threads blocked
        in ``get()`` wake with QueueClosed. An attached facade leaves the queue
        open: only its own blocked calls are cancelled (they raise QueueClosed; a
        ``get()`` takes nothing, a ``put()`` may have been stored).

        An attached facade may be closed on the loop's thread too (it does not
        wait); closing a facade that owns its loop there raises LoopThreadError.
        """
        if self._runner is not None and self._on_loop_thread():
            raise LoopThreadError(f"close() on the event loop thread of {self!r}; "
                                  "use aclose() of the async queue there")
        with self._lock:
            first = not self._closed
            self._closed = True
        if not first:
            self._done.wait()
            return
        try:
            if self._runner is None:
                tasks = self._tasks

                def cancel_calls() -> None:
                    for t in list(tasks):
                        t.cancel()

                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs
                    self._loop.call_soon_threadsafe(cancel_calls)
            else:
                try:
                    asyncio.run_coroutine_threadsafe(self._q.aclose(), self._loop).result()
                finally:
                    self._runner.stop()
        finally:
            self._done.set()

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def __enter__(self) -> _Facade[_Q]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if getattr(self, "_runner", None) is not None and not self._closed:
            _warn(f"unclosed {self!r}", ResourceWarning, source=self)
            # Release the files and the thread without waiting here.
            self._closed = True
            runner = self._runner
            q = self._q  # not self: the coroutine must not keep the facade alive
            assert runner is not None

            async def close_and_stop() -> None:
                try:
                    await q.aclose()
                finally:
                    runner.loop.stop()

            try:
                asyncio.run_coroutine_threadsafe(close_and_stop(), runner.loop)
            except RuntimeError:
                pass

    def __repr__(self) -> str:
        how = "owns its loop" if self._runner is not None else "attached"
        state = "closed" if self._closed else "open"
        return f"<sync {self._q!r} {how}, facade {state}>"

    # ------------------------------------------------------------------ shared reads

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._q.name

    @property
    def directory(self) -> str:
        """The directory holding the queue's files."""
        return self._q.directory

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop that runs the queue."""
        return self._loop

    def qsize(self) -> int:
        """As the async queue's ``qsize()``."""
        return self._peek(self._q.qsize)

    def __len__(self) -> int:
        return self.qsize()

    def empty(self) -> bool:
        """True if ``qsize() == 0``."""
        return self.qsize() == 0

    def sync(self) -> None:
        """As the async queue's ``sync()``: make everything put so far durable now.

        Raises QueueClosed if the queue is closed, DiskQueueError if the sync fails.
        """
        self._call(self._q.sync())

    def purge(self) -> None:
        """As the async queue's ``purge()``: drop every message not yet taken.

        Raises QueueClosed if the queue is closed, DiskQueueError on I/O errors.
        """
        self._call(self._q.purge())


async def _get_within(get: Callable[[], Awaitable[_R]], timeout: float | None) -> _R:
    """``await get()``, giving up after ``timeout`` seconds with Empty.

    The timeout cancels the core's ``get()`` while it waits, which takes nothing;
    ``asyncio.timeout`` turns that cancellation into TimeoutError only if it was
    the timeout's own.
    """
    if timeout is None:
        return await get()
    try:
        async with asyncio.timeout(timeout):
            return await get()
    except TimeoutError:
        raise Empty(f"no message within {timeout} s") from None

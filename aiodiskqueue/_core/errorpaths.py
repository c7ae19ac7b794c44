"""The error paths of the ioLoop: turning any failure into a DiskQueueError for
every waiter, the retry and backoff of failing sync rounds, logging an error
once per interval, and keeping the depth from falling below what is known to be
unread. :class:`~aiodiskqueue._core.engine.Engine` is its subclass.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .._format.access import as_queue_error
from .._format.layout import Layout
from ..errors import DiskQueueError
from .buffers import Lifecycle, QueueBuffers, describe_error, fail, wake
from .options import Options
from .store import Job, JobResult

log = logging.getLogger(__name__)

# A failing sync round is retried with a doubling delay, from sync_interval up to this.
_SYNC_BACKOFF_MAX = 60.0
# The same error is logged at most once per this many seconds.
_LOG_EVERY = 10.0
# Close: attempts at the final write and sync, and the pause before each retry.
_CLOSE_ATTEMPTS = 3
_CLOSE_BACKOFF = (0.05, 0.25)


class ErrorPaths(QueueBuffers):
    """What the engine does when something fails."""

    def __init__(self, layout: Layout, opts: Options) -> None:
        super().__init__(layout, opts)
        self._sync_due_at = 0.0
        self._sync_failures = 0  # consecutive failed sync rounds
        self._logged: dict[str, float] = {}  # error text -> when it was last logged
        self._recount_wanted = False  # the depth is known to be wrong: recount it
        self._recounted_at: tuple[int, int] | None = None  # read cursor of the last recount
        self.meta_held = False  # hold_meta(): close stores no meta
        self._unstored = 0  # put_nowait messages lost to failed writes since write_error was taken

    @property
    def recount_wanted(self) -> bool:
        """Is the depth known to be wrong, so that the next hop recounts it?"""
        return self._recount_wanted

    def _failure(self, exc: BaseException) -> DiskQueueError:
        """The DiskQueueError a waiter gets for ``exc`` raised by a hop."""
        if isinstance(exc, DiskQueueError):
            return exc
        if isinstance(exc, PermissionError):
            return as_queue_error(exc, self.layout.directory)
        err = DiskQueueError(f"queue {self.layout.name!r}: {describe_error(exc)}")
        err.__cause__ = exc
        return err

    def _fail_flight(self, flight: Any, exc: BaseException) -> None:
        """Fail the waiters of a flight whose result cannot be applied."""
        err = self._failure(exc)
        fail(flight.waiters, err)
        fail(flight.sync_waiters, err)

    if TYPE_CHECKING:  # the engine's, used by _final_flush()
        def _build_job(self, pipelined: bool) -> Job | None: ...
        def _dispatch(self, job: Job) -> Any: ...
        def apply(self, flight: Any, res: JobResult) -> None: ...
        def _meta_changed(self) -> bool: ...

    async def _final_flush(self) -> None:
        """Write what is pending and sync the data and meta, for close.

        Up to ``_CLOSE_ATTEMPTS`` attempts with a pause between them; then it gives
        up with one logged error. The files stay consistent: the meta on disk is
        the last one stored, and the next open recovers the records written after
        it, as after a kill.
        """
        self.settle()
        self.state = Lifecycle.CLOSING
        failures = 0
        for _ in range(_CLOSE_ATTEMPTS + 2):  # a write, a sync, and their retries
            if (job := self._build_job(pipelined=False)) is None:
                return
            if self.meta_held:
                job.meta_read = None
            flight = self._dispatch(job)
            res: JobResult = await flight.fut
            self.apply(flight, res)
            if not (job.sync and not res.synced) and res.write_error is None:
                continue
            failures += 1
            if failures >= _CLOSE_ATTEMPTS:
                break
            await asyncio.sleep(_CLOSE_BACKOFF[min(failures, len(_CLOSE_BACKOFF)) - 1])
        if self.since_sync > 0 or (self._meta_changed() and not self.meta_held):
            log.error("%s: closed without storing the last state after %d failed attempt(s); "
                      "the files are consistent and the next open recovers what was written "
                      "after the last stored meta", self.layout.meta_path, failures)

    def hold_meta(self) -> None:
        """Close without storing a meta file: the one on disk stays as it is.

        For a layer that keeps its own record of what was taken (AckQueue's ack
        log) and could not store it: a meta past those records would lose them.
        The next open recovers every record written after the stored meta.
        """
        self.meta_held = True

    def _write_failed(self, n: int, batch: list[asyncio.Future[None]], exc: OSError) -> None:
        """A hop's write of ``n`` messages failed: fail the puts waiting for it, or keep
        the error for the next ``sync()`` if they were ``put_nowait`` calls."""
        err = DiskQueueError(f"write to {self.layout.segment_path(self.write_at[0])} failed, "
                             f"{n} message(s) not stored: {exc}")
        err.__cause__ = exc
        self._log_error(str(exc), "%s", err)
        self.since_sync = max(0, self.since_sync - n)
        self.sync_counted()
        if not batch:
            self._note_unstored(n, err)
        fail(batch, err)

    def _note_unstored(self, n: int, err: DiskQueueError) -> None:
        """Keep the failure of a ``put_nowait`` batch for the next ``sync()``: one error
        counting every message lost since the last one was reported."""
        if self.write_error is None:
            self._unstored = 0
        self._unstored += n
        if self._unstored == n:
            self.write_error = err
        else:
            total = DiskQueueError(f"{self._unstored} message(s) put with put_nowait() not "
                                   f"stored since the last sync(); the latest failure: {err}")
            total.__cause__ = err.__cause__
            self.write_error = total

    def _log_error(self, key: str, msg: str, *args: Any) -> None:
        """Log an error, at most once per ``_LOG_EVERY`` seconds for the same ``key``."""
        loop = self.loop
        now = loop.time() if loop is not None else 0.0
        last = self._logged.get(key)
        if last is not None and now - last < _LOG_EVERY:
            return
        if len(self._logged) > 64:
            self._logged.clear()
        self._logged[key] = now
        log.error(msg, *args)

    def _sync_failed(self, cause: OSError | None, callers: bool) -> DiskQueueError:
        """Account for a failed sync round; return the error for its sync() callers.

        The next round is put off by a doubling delay. A ``put_nowait`` batch that
        failed before is reported with it, once.
        """
        self._sync_failures += 1
        loop = self.loop
        assert loop is not None
        interval = self.opts.sync_interval
        delay = min(interval * 2 ** (self._sync_failures - 1), max(interval, _SYNC_BACKOFF_MAX))
        self._sync_due_at = loop.time() + delay
        msg = f"sync of {self.layout.meta_path} failed: {cause}"
        # Only a sync() caller reports it: a timer round leaves it for the next sync().
        earlier = self.take_write_error() if callers else None
        if earlier is not None:
            msg += f"; before it, {earlier}"
        err = DiskQueueError(msg)
        err.__cause__ = cause
        self._log_error(str(cause), "%s (attempt %d; next in %.1f s)", err,
                        self._sync_failures, delay)
        return err

    def _sync_succeeded(self) -> None:
        if self._sync_failures:
            log.warning("%s: sync works again after %d failed attempt(s)",
                        self.layout.meta_path, self._sync_failures)
            self._sync_failures = 0
            self._logged.clear()

    def sync_may_retry(self) -> bool:
        """False while a failed sync round waits for its retry time."""
        if not self._sync_failures:
            return True
        loop = self.loop
        assert loop is not None
        return loop.time() >= self._sync_due_at

    def _check_depth_floor(self) -> None:
        """Never a depth below what is known to be unread: every ready record, plus one
        while a record is known to remain on disk. A depth below that (a wrong meta file)
        is raised to it at once and recounted exactly by the next hop."""
        # A record is known to remain only where the write position has records before
        # it that the cursor has not passed: in the write file itself. A cursor in an
        # earlier file with the write position at the start of its file may be at the
        # end of a completed segment followed by empty ones (a roll, or a tail cut to 0
        # bytes by recovery): no record at all. After a recount from this cursor its
        # result is the truth (what lies before the write position may be damage).
        (rf, rp), (wf, wp) = self.read_at, self.write_at
        on_disk = (rp < wp if rf == wf else rf < wf and wp > 0) \
            and self.read_at != self._recounted_at
        floor = len(self.ready) + (1 if on_disk else 0)
        if self.depth < floor:
            log.warning("%s: depth %d is below the %d record(s) known to be unread; "
                        "recounting", self.layout.meta_path, self.depth, floor)
            self.depth = floor
            if on_disk:
                self._recount_wanted = True
                wake(self.sync_req)


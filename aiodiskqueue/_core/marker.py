"""The empty-message marker: a durable file that says a queue holds empty messages.

Recovery cuts a run of zero-length records past the meta's write position as a
zero-filled tail unless this file exists (see ``zero_filled_tail`` in
``_format/scan.py``), so a queue makes it durable before it reports an empty
message durable: ``put(b"")`` and ``put_many`` wait for it before accepting the
item, ``put_nowait(b"")`` starts it, and ``sync()`` and ``aclose()`` wait for it.
Once per queue object; the file is never removed by the queue (``purge()`` keeps it).
"""

from __future__ import annotations

import asyncio
import logging
import os

from .._format.access import open_file
from .._format.layout import Layout, fsync_dir
from ..errors import DiskQueueError, QueuePermissionError

log = logging.getLogger(__name__)


def make_marker(layout: Layout) -> None:
    """Create the marker file if needed and make it durable: the file, then its name.

    Raises OSError if it cannot be created or synced.
    """
    fd = open_file(layout.empty_marker_path, os.O_WRONLY | os.O_CREAT, layout.file_mode)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(layout.directory)


class EmptyMarker:
    """Makes a queue's marker durable once, in an executor thread; remembers it."""

    __slots__ = ("_fut", "_layout", "_made", "_wanted")

    def __init__(self, layout: Layout) -> None:
        self._layout = layout
        self._made = False  # durable, by this object
        self._wanted = False  # an empty message was accepted: sync() needs the marker
        self._fut: asyncio.Future[None] | None = None

    @property
    def made(self) -> bool:
        """Whether this object made the marker durable."""
        return self._made

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start making it on ``loop``'s executor (``put_nowait(b"")``): the next
        :meth:`ensure_if_wanted` waits for it."""
        self._wanted = True
        if not self._made and self._fut is None:
            self._fut = loop.run_in_executor(None, make_marker, self._layout)

    async def ensure(self) -> None:
        """Make it durable if it is not yet; returns once it is.

        Cancelling the caller does not stop the making (shielded): the next caller
        waits for the same attempt.

        Raises DiskQueueError (chained to the OSError) if it cannot be made; the next
        call tries again.
        """
        if self._made:
            return
        self.start(asyncio.get_running_loop())
        fut = self._fut
        assert fut is not None
        try:
            await asyncio.shield(fut)
        except OSError as exc:
            if self._fut is fut:
                self._fut = None
            if isinstance(exc, QueuePermissionError):
                raise
            raise DiskQueueError(f"cannot make {self._layout.empty_marker_path} durable, so "
                                 f"an empty message cannot be stored: {exc}") from exc
        self._made = True
        self._fut = None

    async def ensure_if_wanted(self) -> None:
        """For ``sync()``: make it durable if an empty message was accepted.

        Raises DiskQueueError as :meth:`ensure` does.
        """
        if self._wanted and not self._made:
            await self.ensure()

    async def ensure_if_wanted_quietly(self) -> None:
        """For ``aclose()``: as :meth:`ensure_if_wanted`, but a failure is logged, not raised."""
        try:
            await self.ensure_if_wanted()
        except DiskQueueError as exc:
            log.error("%s", exc)

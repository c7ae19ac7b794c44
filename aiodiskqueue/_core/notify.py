"""Waiting for a file to change without busy polling.

On Linux an inotify watch (``inotify_init1`` and ``inotify_add_watch`` through ctypes)
whose descriptor the event loop watches with ``add_reader``: an idle waiter costs
nothing. Where inotify is missing (not Linux, no libc symbol, out of watches) or gives
no events (NFS and other network filesystems do not report another host's writes),
the waiter polls with backoff: 1 ms, doubling up to 100 ms, back to 1 ms after a change.
With inotify the waiter still looks once a second, in case an event was missed.

A watch made with ``on_change`` calls it instead (at each change, poll tick and look):
no future per wait, for a reader that handles a change right where it is notified. Such a
watch can hold its calls for a while (:meth:`FileWatch.hold`): a file changed many times
a millisecond then wakes its reader once per hold, not once per change.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_IN_MODIFY = 0x2
_IN_ATTRIB = 0x4
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
FILE_CHANGES = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE
"""A file was written, or closed after writing (the default mask of a watch)."""
DIR_CHANGES = (_IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE
               | _IN_DELETE)
"""An entry of a watched directory was created, removed, renamed, written, or closed
after writing (a process that held it open for writing ended)."""
POLL_MIN = 0.001
POLL_MAX = 0.1
_WATCHED_CHECK = 1.0
_EVENTS_READ = 65536


#: Filesystems whose reads of what a process of this host has just written come from this
#: host's page cache (``statfs``'s ``f_type``): ext2/3/4, XFS, Btrfs, tmpfs, F2FS, ZFS,
#: overlayfs, bcachefs. Not network or FUSE filesystems, whose reads may wait on a server.
LOCAL_FS_TYPES = frozenset({0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0xF2F52010,
                            0x2FC12FC1, 0x794C7630, 0xCA451A4E})


def local_fs(path: str) -> bool:
    """Is ``path`` on one of :data:`LOCAL_FS_TYPES`? False where that cannot be told
    (not Linux, no libc symbol, statfs fails)."""
    libc = _libc()
    if libc is None:
        return False
    buf = ctypes.create_string_buffer(256)  # struct statfs: f_type (a long) comes first
    try:
        if libc.statfs(os.fsencode(path), buf) != 0:
            return False
    except (AttributeError, ValueError):
        return False
    return (ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF) in LOCAL_FS_TYPES


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


class FileWatch:
    """Wakes a waiter when the file at ``path`` is written (or after a poll interval).

    ``mask``: the inotify events that count, :data:`FILE_CHANGES` by default;
    :data:`DIR_CHANGES` watches a directory's entries. With ``on_change`` the watch calls
    it (on the loop) at each change, poll tick and periodic look, from construction
    until :meth:`close`, and :meth:`wait` is not used.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, path: str,
                 use_inotify: bool = True, mask: int = FILE_CHANGES,
                 on_change: Callable[[], None] | None = None) -> None:
        self.loop = loop
        self.path = path
        self._on_change = on_change
        self._tick: asyncio.TimerHandle | None = None  # with on_change: the next look or poll
        self._held: asyncio.TimerHandle | None = None  # the end of a hold (see hold)
        self._fd = -1
        self._waiter: asyncio.Future[None] | None = None
        self._missed = False  # a change came while no waiter waited: the next wait() ends
        self._delay = POLL_MIN
        # With inotify: the once-a-second look, armed by a wait() while none is due,
        # shared by the waits until it ends (a wait per change would arm a timer each).
        self._check: asyncio.TimerHandle | None = None
        libc = _libc() if use_inotify else None
        if libc is not None:
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd >= 0:
                wd = libc.inotify_add_watch(fd, os.fsencode(path), mask)
                if wd >= 0:
                    self._fd = fd
                    loop.add_reader(fd, self._readable)
                else:
                    os.close(fd)
            if self._fd < 0:
                log.info("%s: no inotify watch (errno %d); polling for changes", path,
                         ctypes.get_errno())
        if on_change is not None:
            self._tick = loop.call_later(_WATCHED_CHECK if self._fd >= 0 else POLL_MIN,
                                         self._on_tick)

    @property
    def inotify(self) -> bool:
        """Whether changes are notified (else polled)."""
        return self._fd >= 0

    def _readable(self) -> None:
        # Events of a file watch have no name: 16 bytes each. A read that does not fill
        # the buffer drained the queue; events that come after make the descriptor
        # readable again (add_reader is level-triggered).
        try:
            while len(os.read(self._fd, _EVENTS_READ)) == _EVENTS_READ:
                pass
        except BlockingIOError:
            pass
        if self._on_change is not None:
            self._on_change()
            return
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        else:
            self._missed = True

    def changed(self) -> None:
        """The file was seen to change: the next poll comes soon again."""
        self._delay = POLL_MIN
        if self._on_change is not None and self._fd < 0:
            # The tick armed before may be up to POLL_MAX away: the next one comes soon.
            if self._tick is not None:
                self._tick.cancel()
            self._tick = self.loop.call_later(POLL_MIN, self._on_tick)

    def _on_tick(self) -> None:
        """With ``on_change``: the periodic look (inotify) or the poll tick (backoff)."""
        cb = self._on_change
        assert cb is not None
        if self._fd >= 0:
            delay = _WATCHED_CHECK
        else:
            delay = self._delay
            self._delay = min(POLL_MAX, delay * 2)
        self._tick = self.loop.call_later(delay, self._on_tick)
        if self._held is None:  # a hold ends with a call anyway
            cb()  # may call changed(), which arms the next poll sooner

    def hold(self, delay: float) -> bool:
        """With ``on_change`` and inotify: make no call for the changes of the next
        ``delay`` seconds (the loop is not even woken for them), then one call, whether
        the file changed or not. False (nothing held) where there is no such watch, or
        while a hold runs."""
        if self._on_change is None or self._fd < 0 or self._held is not None:
            return False
        self.loop.remove_reader(self._fd)
        self._held = self.loop.call_later(delay, self._end_hold)
        return True

    def _end_hold(self) -> None:
        self._held = None
        cb = self._on_change
        if cb is None or self._fd < 0:
            return
        self.loop.add_reader(self._fd, self._readable)
        try:  # the changes of the hold: this call covers them
            while len(os.read(self._fd, _EVENTS_READ)) == _EVENTS_READ:
                pass
        except BlockingIOError:
            pass
        cb()

    def wait(self) -> asyncio.Future[None]:
        """A future resolved at the next change (inotify) or poll tick (backoff); at once
        if a change was notified since the last one ended (the caller may have looked
        at the file before it)."""
        w = self.notified()
        if w.done():
            return w
        if self._fd >= 0:
            if self._check is None:
                self._check = self.loop.call_later(_WATCHED_CHECK, self._look)
            return w
        delay = self._delay
        self._delay = min(POLL_MAX, delay * 2)
        handle = self.loop.call_later(delay, _wake, w)
        w.add_done_callback(lambda _f: handle.cancel())
        return w

    def notified(self) -> asyncio.Future[None]:
        """A future resolved at the next change inotify reports (at once if one came since
        the last waiter ended), without the periodic look or polling: never where
        changes are not notified. For a waiter that learns of changes otherwise too."""
        w = self.loop.create_future()
        self._waiter = w
        if self._missed:
            self._missed = False
            w.set_result(None)
        return w

    def _look(self) -> None:
        """The periodic look with inotify: the waiter of the moment wakes, in case a
        change was missed."""
        self._check = None
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def close(self) -> None:
        """Stop watching; idempotent."""
        self._on_change = None
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if self._held is not None:
            self._held.cancel()
            self._held = None
        if self._check is not None:
            self._check.cancel()
            self._check = None
        if self._fd >= 0:
            self.loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

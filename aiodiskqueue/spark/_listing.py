"""One listing of a queue directory serves every queue in it.

A stream planning a micro-batch over ``events-*`` looks at every matching
queue. Listing the directory once per queue costs O(queues x files); one
``scandir`` with a ``stat`` of each queue file costs O(files), and the
:attr:`QueueFiles.key` of each queue tells whether anything changed since the
previous listing without opening a file. A :class:`Lister` keeps the
:class:`QueueFiles` of the previous listing and hands back the same object for
a queue whose files did not change, so callers can tell "unchanged" by identity.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ._errors import PathNotFound

_ENTRY_RE = re.compile(r"\A(.+)\.diskqueue\.(meta|\d+)\.dat\Z")

# (segment number, -1 for the meta file; size; mtime_ns; inode; name)
Stat = tuple[int, int, int, int, str]


@dataclass(frozen=True, slots=True)
class QueueFiles:
    """The files of one queue as one listing saw them."""

    segments: dict[int, str] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    meta: tuple[int, int, int] | None = None  # (inode, size, mtime_ns): replaced on each store
    mtime: float = 0.0  # the newest modification time of its meta and segments
    key: tuple[Stat, ...] = ()  # every file's stat, sorted: equal exactly when nothing changed

    def signature(self) -> tuple[object, ...]:
        """Equal for two listings exactly when no segment or meta file changed."""
        return self.key


Listing = dict[str, QueueFiles]


def check_directory(path: str, name: str) -> None:
    """Raises PathNotFound if ``path`` does not exist or is not a directory."""
    if not os.path.exists(path):
        raise PathNotFound(path, name, "does not exist")
    if not os.path.isdir(path):
        raise PathNotFound(path, name, "is not a directory")


_names: dict[str, tuple[str, int] | None] = {}
_UNSEEN = ("", 0)


def _parse(entry: str) -> tuple[str, int] | None:
    """``(queue, segment number)`` of a directory entry (-1 for the meta file), or None if
    it is no queue file; remembered, since the same names come back on every trigger."""
    m = _ENTRY_RE.match(entry)
    out = None if m is None else (m.group(1), -1 if m.group(2) == "meta" else int(m.group(2)))
    if len(_names) > 1 << 18:
        _names.clear()
    _names[entry] = out
    return out


def _files(path: str, key: tuple[Stat, ...]) -> QueueFiles:
    segs: dict[int, str] = {}
    sizes: dict[int, int] = {}
    meta = None
    for num, size, mtime_ns, ino, name in key:
        if num < 0:
            meta = (ino, size, mtime_ns)
        else:
            segs[num] = os.path.join(path, name)
            sizes[num] = size
    return QueueFiles(segs, sizes, meta, max(s[2] for s in key) / 1e9, key)


class Lister:
    """Lists the queues of one directory again and again (one ``scandir`` each time),
    reusing the :class:`QueueFiles` of every queue whose files did not change."""

    def __init__(self, path: str, accept: Callable[[str], bool], name: str = "") -> None:
        self.path = path
        self.name = name
        self._accept = accept
        self._accepted: dict[str, bool] = {}
        self._known: Listing = {}

    def __call__(self, settled: Mapping[str, QueueFiles] | None = None) -> Listing:
        """The queues accepted by ``accept``, with their files and sizes, in name order.

        ``settled`` names queues (with the files a listing before saw) whose meta file
        is not looked at again while its inode stays the same: a queue read to the end
        of its last segment gets new records only by that segment growing or a new one
        appearing, which the listing sees. That saves one ``stat`` per drained queue.

        Raises PathNotFound (naming ``name``, the option) if the directory is
        missing or not a directory.
        """
        try:
            entries = os.scandir(self.path)
        except (FileNotFoundError, NotADirectoryError):
            check_directory(self.path, self.name)
            raise
        seen: dict[str, list[Stat]] = {}
        names, accepted = _names, self._accepted
        settled = settled or {}
        with entries:
            for entry in entries:
                name = entry.name
                parsed = names.get(name, _UNSEEN)
                if parsed is _UNSEEN:
                    parsed = _parse(name)
                if parsed is None:
                    continue
                queue, num = parsed
                ok = accepted.get(queue)
                if ok is None:
                    ok = accepted[queue] = self._accept(queue)
                if not ok:
                    continue
                stats = seen.get(queue)
                if stats is None:
                    stats = seen[queue] = []
                if num < 0 and queue in settled:
                    old = settled[queue].key[0]
                    if old[0] < 0 and old[3] == entry.inode():
                        stats.append(old)
                        continue
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue  # removed since the listing: as if it had not been there
                stats.append((num, st.st_size, st.st_mtime_ns, st.st_ino, name))
        if len(accepted) > 1 << 16:
            accepted.clear()
        known = self._known
        out: Listing = {}
        for queue in sorted(seen):
            stats = seen[queue]
            if not stats:
                continue
            stats.sort()
            key = tuple(stats)
            files = known.get(queue)
            if files is None or files.key != key:
                files = _files(self.path, key)
            out[queue] = files
        self._known = out
        return out


def list_queues(path: str, accept: Callable[[str], bool], name: str = "") -> Listing:
    """The queues in ``path`` accepted by ``accept``, with their files and sizes.

    Raises PathNotFound (naming ``name``, the option) if ``path`` is missing or not a
    directory.
    """
    return Lister(path, accept, name)()

"""One listing of a queue directory serves every queue in it.

A stream planning a micro-batch over ``events-*`` looks at every matching
queue. Listing the directory once per queue costs O(queues x files); one
``scandir`` with the sizes of the segment files costs O(files), and the
:class:`Signature` of each queue tells whether anything changed since the
previous trigger without opening a file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ._errors import PathNotFound

_ENTRY_RE = re.compile(r"\A(.+)\.diskqueue\.(meta|\d+)\.dat\Z")


@dataclass(frozen=True, slots=True)
class QueueFiles:
    """The files of one queue as one listing saw them."""

    segments: dict[int, str] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    meta: tuple[int, int, int] | None = None  # (inode, size, mtime_ns): replaced on each store
    mtime: float = 0.0  # the newest modification time of its meta and segments

    def signature(self) -> tuple[object, ...]:
        """Equal for two listings exactly when no segment or meta file changed."""
        return (self.meta, tuple(sorted(self.sizes.items())))


Listing = dict[str, QueueFiles]


def check_directory(path: str, name: str) -> None:
    """Raises PathNotFound if ``path`` does not exist or is not a directory."""
    if not os.path.exists(path):
        raise PathNotFound(path, name, "does not exist")
    if not os.path.isdir(path):
        raise PathNotFound(path, name, "is not a directory")


_names: dict[str, tuple[str, int] | None] = {}


def _parse(entry: str) -> tuple[str, int] | None:
    """``(queue, segment number)`` of a directory entry (-1 for the meta file), or None if
    it is no queue file; remembered, since the same names come back on every trigger."""
    try:
        return _names[entry]
    except KeyError:
        pass
    m = _ENTRY_RE.match(entry)
    out = None if m is None else (m.group(1), -1 if m.group(2) == "meta" else int(m.group(2)))
    if len(_names) > 1 << 18:
        _names.clear()
    _names[entry] = out
    return out


def list_queues(path: str, accept: Callable[[str], bool], name: str = "") -> Listing:
    """The queues in ``path`` accepted by ``accept``, with their files and sizes.

    Raises PathNotFound (naming ``name``, the option) if ``path`` is missing or not a
    directory.
    """
    found: dict[str, tuple[dict[int, str], dict[int, int], list[tuple[int, int, int]],
                           list[float]]] = {}
    try:
        entries = os.scandir(path)
    except (FileNotFoundError, NotADirectoryError):
        check_directory(path, name)
        raise
    accepted: dict[str, bool] = {}
    with entries:
        for entry in entries:
            parsed = _parse(entry.name)
            if parsed is None:
                continue
            queue, num = parsed
            ok = accepted.get(queue)
            if ok is None:
                ok = accepted[queue] = accept(queue)
            if not ok:
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue  # removed since the listing: as if it had not been there
            have = found.get(queue)
            if have is None:
                have = found[queue] = ({}, {}, [], [])
            segs, sizes, meta, mtimes = have
            mtimes.append(st.st_mtime)
            if num < 0:
                meta.append((st.st_ino, st.st_size, st.st_mtime_ns))
            else:
                segs[num] = entry.path
                sizes[num] = st.st_size
    return {
        name: QueueFiles(segs, sizes, meta[0] if meta else None, max(mtimes))
        for name, (segs, sizes, meta, mtimes) in sorted(found.items())
    }

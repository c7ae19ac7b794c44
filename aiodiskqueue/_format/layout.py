"""File names of a queue in its directory, and the small filesystem helpers around them."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


def fsync_dir(path: str) -> None:
    """fsync a directory so that creates, renames and deletes in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def free_bad_name(path: str) -> str:
    """``path + ".bad"``, or ``.bad.1``, ``.bad.2``, ... if taken: never overwrites a
    ``.bad`` file."""
    dst = path + ".bad"
    i = 1
    while os.path.exists(dst):
        dst = f"{path}.bad.{i}"
        i += 1
    return dst


def file_size(path: str) -> int:
    """The size of ``path`` in bytes; 0 if it does not exist."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


FILE_MODE = 0o600
"""The default mode of the files a queue creates: owner-only, as go-diskqueue's and nsqd's
(the ``file_mode`` option)."""
DIR_MODE = 0o700
"""The default mode of the directories a queue creates (the ``dir_mode`` option)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the files of queue ``name`` live inside ``directory``, and the modes the
    queue creates them with (its ``file_mode`` and ``dir_mode`` options)."""

    directory: str
    name: str
    file_mode: int = FILE_MODE
    dir_mode: int = DIR_MODE

    @property
    def meta_path(self) -> str:
        """``NAME.diskqueue.meta.dat``."""
        return os.path.join(self.directory, f"{self.name}.diskqueue.meta.dat")

    @property
    def lock_path(self) -> str:
        """``NAME.diskqueue.lock``: held with flock while a process has the queue open."""
        return os.path.join(self.directory, f"{self.name}.diskqueue.lock")

    def role_path(self, role: str) -> str:
        """``NAME.diskqueue.producer`` or ``.consumer``: a role's lock and published state."""
        return os.path.join(self.directory, f"{self.name}.diskqueue.{role}")

    @property
    def roles_path(self) -> str:
        """``NAME.diskqueue.roles``: the meta writers' lock and the meta's sequence numbers."""
        return os.path.join(self.directory, f"{self.name}.diskqueue.roles")

    def segment_path(self, num: int) -> str:
        """``NAME.diskqueue.%06d.dat`` (wider numbers are not truncated)."""
        return os.path.join(self.directory, f"{self.name}.diskqueue.{num:06d}.dat")

    def _pattern(self, suffix: str) -> re.Pattern[str]:
        return re.compile(rf"\A{re.escape(self.name)}\.diskqueue\.(\d+)\.dat{suffix}\Z")

    def segments(self) -> dict[int, str]:
        """Existing segment files, by number."""
        pat = self._pattern("")
        found: dict[int, str] = {}
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return found
        for entry in entries:
            m = pat.match(entry)
            if m:
                found[int(m.group(1))] = os.path.join(self.directory, entry)
        return found

    def bad_files(self) -> list[str]:
        """Quarantined segments (``*.dat.bad``), sorted by name."""
        pat = self._pattern(r"\.bad(?:\.\d+)?")
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(os.path.join(self.directory, e) for e in entries if pat.match(e))

    def meta_temp_files(self) -> list[str]:
        """Temp files of interrupted meta stores (``NAME.diskqueue.meta.dat.PID.tmp``)."""
        pat = re.compile(rf"\A{re.escape(self.name)}\.diskqueue\.meta\.dat\.\d+\.tmp\Z")
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(os.path.join(self.directory, e) for e in entries if pat.match(e))

    def free_bad_path(self, num: int) -> str:
        """A ``.bad`` name for segment ``num`` not taken yet (``.bad``, ``.bad.1``, ...)."""
        return free_bad_name(self.segment_path(num))

    def quarantine(self, num: int) -> str:
        """Rename segment ``num`` to ``.bad`` (never overwriting an older one); return the
        new path."""
        dst = self.free_bad_path(num)
        os.rename(self.segment_path(num), dst)
        return dst

    @property
    def empty_marker_path(self) -> str:
        """``NAME.diskqueue.empty``: exists once the queue has accepted an empty message.

        Made durable before the first empty message is accepted, and kept: recovery
        reads zero-length records past the meta's write position as messages only
        when it exists (see ``zero_filled_tail`` in ``_format/scan.py``).
        go-diskqueue ignores the file.
        """
        return os.path.join(self.directory, f"{self.name}.diskqueue.empty")


_QUEUE_RE = re.compile(r"\A(.+)\.diskqueue\.(?:meta|\d+)\.dat\Z")


def queue_names(directory: str) -> list[str]:
    """Names of the queues that have a meta file or segments in ``directory``, sorted."""
    names = set()
    for entry in os.listdir(directory):
        m = _QUEUE_RE.match(entry)
        if m:
            names.add(m.group(1))
    return sorted(names)


# ---------------------------------------------------------------------- AckQueue files

DEAD_LETTER_DIR_SUFFIX = ".dead-letters"
"""An AckQueue's dead-letter queue lives in the subdirectory ``NAME.dead-letters``.

A subdirectory rather than a sibling queue ``NAME.dead``: every queue's own
file name ends in ``.dat``, ``.lock``, ``.empty``, ``.tmp``, ``.bad[.N]`` or ``.log``, and
no queue name can contain ``/``, so no other queue's files, whatever its
name, can ever be those of a dead-letter queue (an earlier layout used the
sibling ``NAME.dead``, which is also a valid name of an unrelated queue).
"""


def dead_letter_layout(directory: str, name: str, file_mode: int = FILE_MODE,
                       dir_mode: int = DIR_MODE) -> Layout:
    """Where the dead-letter queue of AckQueue ``name`` lives: queue ``name`` in
    ``NAME.dead-letters/``."""
    return Layout(os.path.join(directory, name + DEAD_LETTER_DIR_SUFFIX), name, file_mode,
                  dir_mode)


def legacy_dead_letter_layout(directory: str, name: str) -> Layout:
    """The dead-letter queue's place in the earlier layout: the sibling queue ``NAME.dead``."""
    return Layout(directory, name + ".dead")


def ack_log_path(directory: str, name: str, num: int) -> str:
    """``NAME.ack.%06d.log``: segment ``num`` of AckQueue ``name``'s ack log.

    No other queue's files collide: no DiskQueue file ends in ``.log``, and
    ``.ack.DIGITS.log`` read from the right gives back exactly one ``NAME``.
    """
    return os.path.join(directory, f"{name}.ack.{num:06d}.log")


def ack_log_files(directory: str, name: str) -> dict[int, str]:
    """Existing ack log segments of AckQueue ``name``, by number (exact names only)."""
    pat = re.compile(rf"\A{re.escape(name)}\.ack\.(\d{{6,}})\.log\Z")
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return {}
    return {int(m.group(1)): os.path.join(directory, e) for e in entries if (m := pat.match(e))}


def queue_files(lay: Layout) -> list[str]:
    """Every existing file of the DiskQueue at ``lay``: segments, ``.bad`` ones, meta,
    temps, lock, empty-message marker, role files."""
    out = [*lay.segments().values(), *lay.bad_files(), *lay.meta_temp_files(),
           lay.meta_path, lay.lock_path, lay.empty_marker_path, lay.role_path("producer"),
           lay.role_path("consumer"), lay.roles_path]
    return sorted(p for p in out if os.path.exists(p))


_ACK_LOG_RE = re.compile(r"\A(.+)\.ack\.\d{6,}\.log\Z")


def ack_queue_names(directory: str) -> list[str]:
    """Names of the AckQueues that have an ack log in ``directory``, sorted."""
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted({m.group(1) for e in entries if (m := _ACK_LOG_RE.match(e))})

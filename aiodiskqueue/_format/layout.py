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
    """``path + ".bad"``, or ``.bad.1``, ``.bad.2``, ... if taken: never overwrites a ``.bad`` file."""
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


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the files of queue ``name`` live inside ``directory``."""

    directory: str
    name: str

    @property
    def meta_path(self) -> str:
        """``NAME.diskqueue.meta.dat``."""
        return os.path.join(self.directory, f"{self.name}.diskqueue.meta.dat")

    @property
    def lock_path(self) -> str:
        """``NAME.diskqueue.lock``: held with flock while a process has the queue open."""
        return os.path.join(self.directory, f"{self.name}.diskqueue.lock")

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
        """Rename segment ``num`` to ``.bad`` (never overwriting an older one); return the new path."""
        dst = self.free_bad_path(num)
        os.rename(self.segment_path(num), dst)
        return dst


_QUEUE_RE = re.compile(r"\A(.+)\.diskqueue\.(?:meta|\d+)\.dat\Z")


def queue_names(directory: str) -> list[str]:
    """Names of the queues that have a meta file or segments in ``directory``, sorted."""
    names = set()
    for entry in os.listdir(directory):
        m = _QUEUE_RE.match(entry)
        if m:
            names.add(m.group(1))
    return sorted(names)

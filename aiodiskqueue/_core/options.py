"""Validated options of a queue, and its statistics."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from .._format.layout import DIR_MODE, FILE_MODE

MiB = 1 << 20


_BYTES_TYPES = (bytes, bytearray, memoryview)


def integer(name: str, value: object, lo: int, hi: int | None = None) -> int:
    """An int in ``[lo, hi]``.

    Raises TypeError or ValueError naming the bad value.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def number(name: str, value: object, *, positive: bool) -> float:
    """A finite number, > 0 (``positive``) or >= 0.

    Raises TypeError or ValueError naming the bad value.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or (v <= 0 if positive else v < 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return v


def as_bytes(item: object) -> bytes:
    """A message as ``bytes``, copied from a bytearray or memoryview (the caller may
    change those before the batch is written).

    Raises TypeError for anything else.
    """
    if type(item) is bytes:
        return item
    if isinstance(item, _BYTES_TYPES):
        return bytes(item)
    raise TypeError(f"a message must be bytes, bytearray or memoryview, got {type(item).__name__}")


def check_mode(name: str, value: object, owner: int) -> int:
    """A permission mode: an int in ``[0, 0o777]`` that grants the owner at least the
    bits ``owner`` (``0o600`` read and write for files, ``0o700`` with search for
    directories).

    Raises TypeError or ValueError naming the bad value (in octal).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int such as 0o{owner:o}, got "
                        f"{type(value).__name__} {value!r}")
    if not 0 <= value <= 0o777:
        raise ValueError(f"{name} must be a permission mode in [0o0, 0o777], got {value:#o}")
    if value & owner != owner:
        what = "read and write" if owner == 0o600 else "read, write and search"
        raise ValueError(f"{name} must let the owner {what} ({owner:#o}), got {value:#o}")
    return value


def check_max_items(value: object) -> int:
    """``max_items`` of a ``get_many`` call: an int >= 1.

    Raises TypeError or ValueError naming the bad value.
    """
    return integer("max_items", value, 1)


def check_name(name: object) -> str:
    """Validate a queue name: a non-empty string usable as a file name prefix.

    Raises TypeError or ValueError naming the bad value.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not name or name in (".", "..") or "/" in name or os.sep in name or "\0" in name:
        raise ValueError(f"name must be a plain file name prefix, got {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class Options:
    """Options shared by every queue, with their defaults, checked when made; see the
    README's options table. The one definition of each: the queues' keyword
    parameters are its fields (a test keeps them equal), the checks are here, and an
    AckQueue's data and dead-letter queues get theirs derived from it."""

    NAMES: ClassVar[frozenset[str]]
    """The option names: the fields."""

    max_bytes_per_file: int = 100 * MiB
    min_msg_size: int = 0
    max_msg_size: int = MiB
    sync_every: int = 2500
    sync_interval: float = 2.0
    maxsize: int = 0
    read_buffer_bytes: int = 4 * MiB
    write_buffer_bytes: int = 16 * MiB
    strict: bool = False
    spin_us: int = 250
    inline_writes: bool = False
    file_mode: int = FILE_MODE
    """Mode of every file the queue creates, set exactly (the umask does not apply);
    files that exist keep theirs. Not checked against the other role's: each process
    sets the mode of the files it creates (see docs/guide/processes.md)."""
    dir_mode: int = DIR_MODE
    """Mode of the directories the queue creates (its own, missing parents, dead letters)."""

    def __post_init__(self) -> None:
        integer("max_bytes_per_file", self.max_bytes_per_file, 1)
        integer("min_msg_size", self.min_msg_size, 0, 2**31 - 1)
        integer("max_msg_size", self.max_msg_size, 0, 2**31 - 1)
        if self.min_msg_size > self.max_msg_size:
            raise ValueError(
                f"min_msg_size must be <= max_msg_size, got {self.min_msg_size} > "
                f"{self.max_msg_size}"
            )
        integer("sync_every", self.sync_every, 1)
        number("sync_interval", self.sync_interval, positive=True)
        integer("maxsize", self.maxsize, 0)
        integer("read_buffer_bytes", self.read_buffer_bytes, 4096)
        integer("write_buffer_bytes", self.write_buffer_bytes, 4096)
        integer("spin_us", self.spin_us, 0, 1_000_000)
        check_mode("file_mode", self.file_mode, 0o600)
        check_mode("dir_mode", self.dir_mode, 0o700)
        for flag in ("strict", "inline_writes"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be a bool, got {type(getattr(self, flag)).__name__}")

    @classmethod
    def from_keywords(cls, owner: str, options: Mapping[str, object]) -> Options:
        """The options given as keywords to ``owner`` (a class name), defaults for the rest.

        Raises TypeError for a name that is no option, TypeError or ValueError naming
        a bad value.
        """
        unknown = options.keys() - cls.NAMES
        if unknown:
            raise TypeError(f"{owner}() got an unexpected keyword argument "
                            f"{min(unknown)!r}")
        return cls(**options)  # type: ignore[arg-type]  # each value checked on creation

    def keywords(self) -> dict[str, Any]:
        """The options as keywords for a queue's constructor (``DiskQueue(d, n, **kw)``)."""
        return {name: getattr(self, name) for name in sorted(self.NAMES)}


Options.NAMES = frozenset(f.name for f in dataclasses.fields(Options))


DEFAULTS: Final = Options()
"""Every option's default: the one place DiskQueue, AckQueue, Spark and the broker read them."""


@dataclass(frozen=True, slots=True)
class Statistics:
    """A snapshot of a queue's state and counters; plain numbers only."""

    depth: int
    """Messages accepted and not yet consumed (``qsize()``)."""
    read_file_num: int
    """The consumer position: the segment of the last message taken (or, before any, where
    the oldest unread record starts)."""
    read_pos: int
    """Byte offset just past the last message taken, in ``read_file_num``."""
    write_file_num: int
    """The segment the next record is appended to."""
    write_pos: int
    """Byte offset where the next record starts, in ``write_file_num``."""
    bad_files: int
    """Segments quarantined as ``.bad`` since this queue object opened."""
    bytes_on_disk: int
    puts: int
    gets: int
    syncs: int
    """Completed sync rounds: one per group commit, however many files it fsyncs."""
    ready: int
    """Messages read ahead into memory, ready for ``get_nowait()``."""
    pending_writes: int
    """Messages accepted but not yet written to the OS."""
    recovered: int
    """Records found on open past the meta file's write position."""
    write_path: str
    """Who appends records: ``"native"`` (the C write lane) or ``"python"`` (the I/O thread)."""

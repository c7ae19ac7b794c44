"""Where a queue group lives on disk: the one owner of its names.

Group ``NAME`` in ``DIRECTORY`` is the directory ``DIRECTORY/NAME.group/``::

    NAME.group/
        group.meta          the group's options that every shard shares (JSON, versioned),
                            created once, atomically (a temp file linked into place)
        group.lock          a short flock: claiming, creating and removing shards
        member-<id>.lock    one per live group consumer, flock held while it runs
        000000/ 000001/ ... the shards: each a plain queue NAME (go-diskqueue's files,
                            the role files, an AckQueue's ack log and dead letters)

A shard is a directory so that removing it is one rename: a shard is there or it
is not, never half. Shard names are decimal numbers, zero-padded to six digits
(wider numbers are not truncated); nothing else in the group directory starts with
a digit.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass

from ..errors import GroupFormatError
from .access import make_dirs, open_file
from .layout import DIR_MODE, FILE_MODE, Layout, fsync_dir

GROUP_SUFFIX = ".group"
"""A group's directory is ``NAME`` plus this, beside the plain queues of ``DIRECTORY``."""
GROUP_META = "group.meta"
GROUP_LOCK = "group.lock"
GROUP_FORMAT = "aiodiskqueue-group"
GROUP_VERSION = 1
_SHARD_RE = re.compile(r"\A(\d{6,})\Z")
_MEMBER_RE = re.compile(r"\Amember-([0-9a-f]+)\.lock\Z")
_REMOVING_PREFIX = ".removing-"
_AGREED = ("max_bytes_per_file", "min_msg_size", "max_msg_size")


def shard_name(num: int) -> str:
    """The directory name of shard ``num``: ``%06d``.

    Raises ValueError for a negative number.
    """
    if num < 0:
        raise ValueError(f"a shard number must be >= 0, got {num}")
    return f"{num:06d}"


def parse_shard(entry: str) -> int | None:
    """The shard number of the directory entry ``entry``, None if it is no shard name."""
    m = _SHARD_RE.match(entry)
    return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class GroupMeta:
    """The options every shard of a group must share, as stored in ``group.meta``."""

    max_bytes_per_file: int
    min_msg_size: int
    max_msg_size: int
    version: int = GROUP_VERSION

    def encode(self) -> bytes:
        """The file's bytes: one JSON object, keys sorted, a newline."""
        body = {"format": GROUP_FORMAT, "version": self.version,
                **{k: getattr(self, k) for k in _AGREED}}
        return (json.dumps(body, sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes, path: str) -> GroupMeta:
        """Parse ``data``, the bytes of the group meta at ``path``.

        Raises GroupFormatError naming the path if it is no group meta, or one of
        another format version.
        """
        try:
            body = json.loads(data)
        except (UnicodeDecodeError, ValueError):
            raise GroupFormatError(path, f"not a group meta file: {data[:64]!r}") from None
        if not isinstance(body, dict) or body.get("format") != GROUP_FORMAT:
            raise GroupFormatError(path, f"not a group meta file: {data[:64]!r}")
        version = body.get("version")
        if version != GROUP_VERSION:
            raise GroupFormatError(path, f"format version {version!r}; this release "
                                         f"reads version {GROUP_VERSION}")
        values = [body.get(k) for k in _AGREED]
        if not all(type(v) is int and v >= 0 for v in values):
            raise GroupFormatError(path, f"bad options in {body!r}")
        return cls(*values)  # type: ignore[arg-type]  # ints, checked above

    def differences(self, other: GroupMeta) -> list[tuple[str, int, int]]:
        """``(option, self's value, other's value)`` for each option that differs."""
        return [(k, getattr(self, k), getattr(other, k)) for k in _AGREED
                if getattr(self, k) != getattr(other, k)]


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """Where the files of group ``name`` live inside ``directory``, and the modes the
    group creates them with (its ``file_mode`` and ``dir_mode`` options), as
    :class:`~aiodiskqueue._format.layout.Layout` for a queue."""

    directory: str
    name: str
    file_mode: int = FILE_MODE
    dir_mode: int = DIR_MODE

    @property
    def path(self) -> str:
        """``DIRECTORY/NAME.group``."""
        return os.path.join(self.directory, self.name + GROUP_SUFFIX)

    @property
    def meta_path(self) -> str:
        """``NAME.group/group.meta``."""
        return os.path.join(self.path, GROUP_META)

    @property
    def lock_path(self) -> str:
        """``NAME.group/group.lock``: held (briefly) to claim, create or remove a shard."""
        return os.path.join(self.path, GROUP_LOCK)

    def exists(self) -> bool:
        """Whether the group's directory exists."""
        return os.path.isdir(self.path)

    def shard_path(self, num: int) -> str:
        """The directory of shard ``num``."""
        return os.path.join(self.path, shard_name(num))

    def shard_layout(self, num: int) -> Layout:
        """The plain queue of shard ``num``: queue ``NAME`` in its directory."""
        return Layout(self.shard_path(num), self.name, self.file_mode, self.dir_mode)

    def shards(self) -> dict[int, str]:
        """Existing shards, by number: their directories (an empty dict if the group
        directory does not exist)."""
        try:
            entries = os.listdir(self.path)
        except FileNotFoundError:
            return {}
        out: dict[int, str] = {}
        for entry in entries:
            num = parse_shard(entry)
            if num is not None:
                out[num] = os.path.join(self.path, entry)
        return dict(sorted(out.items()))

    def member_path(self, member: str) -> str:
        """``member-<id>.lock``: a live group consumer holds its flock."""
        return os.path.join(self.path, f"member-{member}.lock")

    def members(self) -> dict[str, str]:
        """Member lock files, by id (live or left by a dead consumer)."""
        try:
            entries = os.listdir(self.path)
        except FileNotFoundError:
            return {}
        return {m.group(1): os.path.join(self.path, e) for e in entries
                if (m := _MEMBER_RE.match(e))}

    def removing_path(self, num: int) -> str:
        """Where shard ``num`` is renamed while it is removed (no shard name: readers of
        the group no longer see it)."""
        return os.path.join(self.path, _REMOVING_PREFIX + shard_name(num))

    def removing(self) -> list[str]:
        """Shards renamed for removal whose removal did not finish."""
        try:
            entries = os.listdir(self.path)
        except FileNotFoundError:
            return []
        return sorted(os.path.join(self.path, e) for e in entries
                      if e.startswith(_REMOVING_PREFIX))


def group_layout(directory: str | os.PathLike[str], name: str, file_mode: int = FILE_MODE,
                 dir_mode: int = DIR_MODE) -> GroupLayout:
    """The layout of group ``name`` in ``directory`` (creating files with ``file_mode``
    and directories with ``dir_mode``)."""
    return GroupLayout(os.fspath(directory), name, file_mode, dir_mode)


def group_dir(directory: str | os.PathLike[str], name: str) -> str:
    """``DIRECTORY/NAME.group``: the directory of group ``name``."""
    return group_layout(directory, name).path


def is_group(directory: str | os.PathLike[str], name: str) -> bool:
    """Whether a group ``name`` exists in ``directory`` (its directory does)."""
    return group_layout(directory, name).exists()


def group_names(directory: str | os.PathLike[str]) -> list[str]:
    """Names of the groups in ``directory`` (directories ``NAME.group``), sorted."""
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(e[:-len(GROUP_SUFFIX)] for e in entries
                  if e.endswith(GROUP_SUFFIX) and len(e) > len(GROUP_SUFFIX)
                  and os.path.isdir(os.path.join(directory, e)))


def read_group_meta(directory: str | os.PathLike[str], name: str) -> GroupMeta | None:
    """The stored group meta of group ``name``, None if there is none yet.

    Raises GroupFormatError if the file is damaged or of another version, OSError if
    it cannot be read.
    """
    path = group_layout(directory, name).meta_path
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except FileNotFoundError:
        return None
    return GroupMeta.decode(data, path)


def create_group_meta(lay: GroupLayout, meta: GroupMeta) -> GroupMeta:
    """Store ``meta`` as the group's meta unless one is stored already; return the one
    stored (``meta`` or the earlier one). Creates the group directory if needed.

    Atomic between processes: the file is written and fsynced under a temp name and
    linked into place (``link`` fails if the name exists), so a reader sees a whole
    file or none, and the first creator wins. Both directories are fsynced after.

    Raises GroupFormatError if the stored one is damaged or of another version,
    OSError if the files cannot be written.
    """
    make_dirs(lay.path, lay.dir_mode)
    stored = read_group_meta(lay.directory, lay.name)
    if stored is not None:
        return stored
    tmp = f"{lay.meta_path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, lay.file_mode)
    with os.fdopen(fd, "wb") as f:
        f.write(meta.encode())
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, lay.meta_path)
    except FileExistsError:
        pass  # another process created it first: its meta is the group's
    finally:
        os.unlink(tmp)
    fsync_dir(lay.path)
    fsync_dir(lay.directory)  # the group directory's own entry: a new group survives a power cut
    stored = read_group_meta(lay.directory, lay.name)
    assert stored is not None
    return stored

"""A FUSE filesystem that simulates a disk cache: what processes see, and what a
power cut would leave.

Run as ``python simfs.py MOUNTPOINT``; it is controlled through its standard input,
one command a line, each answered on standard output (``ok`` or ``error ...``):

- ``reset``: forget every file and start a new round (also ends a freeze);
- ``cut PATH``: freeze (every later operation fails with EIO) and write the state
  to PATH (a pickle read by :mod:`images`);
- ``drop_sync N``: a fault for the self-test: the writes that the Nth file fsync of
  the round from now covers are lost (zeros on the disk) though it answers success.

The model (a strict reading of POSIX, as the ALICE and CrashMonkey studies use):
writes and truncations change only what processes see; ``fsync``/``fdatasync`` of a
file makes its data (and size) durable; creating, renaming (also ``RENAME_EXCHANGE``),
linking and unlinking a name, and making or removing a directory, become durable only
when that directory is fsynced. A file fsynced under a name that no directory fsync
made durable is gone after the cut. What it does not simulate (fallocate, symlinks,
mknod, extended attributes, chmod/chown) answers EOPNOTSUPP, never a silent success.
Locks are left to the kernel (the FUSE default when the filesystem has no lock
operation). Every operation that changes state goes into a log of operations not yet
durable; a sync removes from it what it made durable, so the images of
:mod:`images` can replay any prefix or subset of it over the durable state.

mfusepy (ctypes bindings for libfuse 3, pure Python, maintained) is used rather than
pyfuse3 (needs trio and a compiler against libfuse3-dev); its rename drops the
flags argument, so :class:`_Fuse` passes it on.
"""

from __future__ import annotations

import errno
import os
import pickle
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import mfusepy

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
ROOT = 1


@dataclass
class Node:
    """One inode: a regular file (``data``) or a directory (``entries``)."""

    kind: str  # "f" or "d"
    data: bytearray = field(default_factory=bytearray)
    entries: dict[str, int] = field(default_factory=dict)
    nlink: int = 1
    mtime: int = 0


def _err(code: int) -> mfusepy.FuseOSError:
    return mfusepy.FuseOSError(code)


class SimDisk(mfusepy.Operations):  # type: ignore[misc]
    """The filesystem's operations; every one holds the lock."""

    use_ns = True

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self.reset()

    # ---------------------------------------------------------------- state
    def reset(self) -> None:
        """A fresh, empty, durable root directory."""
        self.nodes: dict[int, Node] = {ROOT: Node("d", nlink=2)}
        self.next_ino = ROOT + 1
        # The durable state: names per directory, data per file.
        self.durable_entries: dict[int, dict[str, int]] = {ROOT: {}}
        self.durable_data: dict[int, bytes] = {}
        # Operations not yet durable, in order: ("ns", group, dir, name, ino | None),
        # ("w", ino, offset, bytes), ("t", ino, size).
        self.pending: list[tuple[Any, ...]] = []
        self.group = 0
        self.frozen = False
        self.drop_sync_at = 0  # the fsync number that is dropped (0: none)
        self.fsyncs = 0
        self.dropped: list[int] = []  # inodes whose dropped fsync was acknowledged
        self.lost: dict[int, list[tuple[int, int]]] = {}  # ino -> (offset, length) lost

    def dump(self) -> dict[str, Any]:
        """Everything :mod:`images` needs, as plain values."""
        return {
            "kinds": {i: n.kind for i, n in self.nodes.items()},
            "visible_data": {i: bytes(n.data) for i, n in self.nodes.items() if n.kind == "f"},
            "visible_entries": {i: dict(n.entries) for i, n in self.nodes.items()
                                if n.kind == "d"},
            "durable_entries": {d: dict(e) for d, e in self.durable_entries.items()},
            "durable_data": dict(self.durable_data),
            "pending": list(self.pending),
            "dropped": list(self.dropped),
        }

    def _check(self) -> None:
        if self.frozen:
            raise _err(errno.EIO)

    def _lookup(self, path: str) -> tuple[int, int, str]:
        """(parent inode, inode or 0, name) of ``path``."""
        parts = [p for p in path.split("/") if p]
        d = ROOT
        for p in parts[:-1]:
            nxt = self.nodes[d].entries.get(p)
            if nxt is None or self.nodes[nxt].kind != "d":
                raise _err(errno.ENOENT)
            d = nxt
        if not parts:
            return 0, ROOT, ""
        return d, self.nodes[d].entries.get(parts[-1], 0), parts[-1]

    def _ino(self, path: str | None, fh: int | None) -> int:
        if fh:
            if fh not in self.nodes:
                raise _err(errno.EIO)
            return fh
        assert path is not None
        _, ino, _ = self._lookup(path)
        if not ino:
            raise _err(errno.ENOENT)
        return ino

    def _set_entry(self, d: int, name: str, ino: int | None) -> None:
        entries = self.nodes[d].entries
        if ino is None:
            entries.pop(name, None)
        else:
            entries[name] = ino
        self.pending.append(("ns", self.group, d, name, ino))

    def _new(self, kind: str) -> int:
        ino = self.next_ino
        self.next_ino += 1
        self.nodes[ino] = Node(kind, nlink=2 if kind == "d" else 1, mtime=time.time_ns())
        if kind == "d":
            self.durable_entries.setdefault(ino, {})
        return ino

    # ---------------------------------------------------------------- names
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self._mutex:
            self._check()
            ino = self._ino(path, fh)
            n = self.nodes[ino]
            mode = (stat.S_IFDIR | 0o755) if n.kind == "d" else (stat.S_IFREG | 0o644)
            size = len(n.data) if n.kind == "f" else 4096
            return {"st_mode": mode, "st_nlink": n.nlink, "st_size": size, "st_ino": ino,
                    "st_uid": os.getuid(), "st_gid": os.getgid(), "st_blksize": 4096,
                    "st_blocks": (size + 511) // 512,
                    "st_mtime": n.mtime, "st_ctime": n.mtime, "st_atime": n.mtime}

    def readdir(self, path: str, fh: int | None) -> list[str]:
        with self._mutex:
            self._check()
            ino = self._ino(path, None)
            return [".", "..", *self.nodes[ino].entries]

    def opendir(self, path: str) -> int:
        with self._mutex:
            self._check()
            return self._ino(path, None)

    def releasedir(self, path: str, fh: int) -> int:
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        with self._mutex:
            self._check()
            d, ino, name = self._lookup(path)
            if ino:
                raise _err(errno.EEXIST)
            new = self._new("d")
            self.group += 1
            self._set_entry(d, name, new)
            return 0

    def rmdir(self, path: str) -> int:
        with self._mutex:
            self._check()
            d, ino, name = self._lookup(path)
            if not ino:
                raise _err(errno.ENOENT)
            if self.nodes[ino].entries:
                raise _err(errno.ENOTEMPTY)
            self.group += 1
            self._set_entry(d, name, None)
            return 0

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        with self._mutex:
            self._check()
            d, ino, name = self._lookup(path)
            if ino:
                if flags & os.O_EXCL:
                    raise _err(errno.EEXIST)
                if flags & os.O_TRUNC:
                    self._truncate(ino, 0)
                return ino
            new = self._new("f")
            self.group += 1
            self._set_entry(d, name, new)
            return new

    def open(self, path: str, flags: int) -> int:
        with self._mutex:
            self._check()
            ino = self._ino(path, None)
            if flags & os.O_TRUNC:
                self._truncate(ino, 0)
            return ino

    def release(self, path: str | None, fh: int) -> int:
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0

    def unlink(self, path: str) -> int:
        with self._mutex:
            self._check()
            d, ino, name = self._lookup(path)
            if not ino:
                raise _err(errno.ENOENT)
            self.nodes[ino].nlink -= 1
            self.group += 1
            self._set_entry(d, name, None)
            return 0

    def link(self, target: str, source: str) -> int:
        with self._mutex:
            self._check()
            src = self._ino(source, None)
            d, ino, name = self._lookup(target)
            if ino:
                raise _err(errno.EEXIST)
            self.nodes[src].nlink += 1
            self.group += 1
            self._set_entry(d, name, src)
            return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        with self._mutex:
            self._check()
            od, oino, oname = self._lookup(old)
            nd, nino, nname = self._lookup(new)
            if not oino:
                raise _err(errno.ENOENT)
            if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE):
                raise _err(errno.EINVAL)
            self.group += 1
            if flags & RENAME_EXCHANGE:
                if not nino:
                    raise _err(errno.ENOENT)
                self._set_entry(od, oname, nino)
                self._set_entry(nd, nname, oino)
                return 0
            if nino:
                if flags & RENAME_NOREPLACE:
                    raise _err(errno.EEXIST)
                if self.nodes[nino].kind == "d":
                    if self.nodes[nino].entries:
                        raise _err(errno.ENOTEMPTY)
                else:
                    self.nodes[nino].nlink -= 1
            if (od, oname) == (nd, nname):
                return 0
            self._set_entry(od, oname, None)
            self._set_entry(nd, nname, oino)
            return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int | None) -> int:
        with self._mutex:
            self._check()
            d = self._ino(path, fh)
            self.durable_entries[d] = dict(self.nodes[d].entries)
            self.pending = [op for op in self.pending if not (op[0] == "ns" and op[2] == d)]
            return 0

    # ---------------------------------------------------------------- data
    def read(self, path: str | None, size: int, offset: int, fh: int | None) -> bytes:
        with self._mutex:
            self._check()
            ino = self._ino(path, fh)
            return bytes(self.nodes[ino].data[offset:offset + size])

    def write(self, path: str | None, data: bytes, offset: int, fh: int | None) -> int:
        with self._mutex:
            self._check()
            ino = self._ino(path, fh)
            buf = self.nodes[ino].data
            if offset > len(buf):
                buf.extend(bytes(offset - len(buf)))
            buf[offset:offset + len(data)] = data
            self.nodes[ino].mtime = time.time_ns()
            self.pending.append(("w", ino, offset, bytes(data)))
            return len(data)

    def _truncate(self, ino: int, length: int) -> None:
        buf = self.nodes[ino].data
        if length < len(buf):
            del buf[length:]
        else:
            buf.extend(bytes(length - len(buf)))
        self.pending.append(("t", ino, length))

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self._mutex:
            self._check()
            self._truncate(self._ino(path, fh), length)
            return 0

    def fsync(self, path: str | None, datasync: int, fh: int | None) -> int:
        with self._mutex:
            self._check()
            ino = self._ino(path, fh)
            self.fsyncs += 1
            if self.fsyncs == self.drop_sync_at:
                # The fault: the writes this fsync covers never reach the disk, though it
                # answers success, now and at every later fsync of the file.
                self.dropped.append(ino)
                self.lost.setdefault(ino, []).extend(
                    (op[2], len(op[3])) for op in self.pending if op[0] == "w" and op[1] == ino)
            data = bytearray(self.nodes[ino].data)
            for off, n in self.lost.get(ino, ()):
                data[off:off + n] = bytes(len(data[off:off + n]))
            self.durable_data[ino] = bytes(data)
            self.pending = [op for op in self.pending if op[0] == "ns" or op[1] != ino]
            return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 20, "f_bfree": 1 << 19,
                "f_bavail": 1 << 19, "f_files": 1 << 16, "f_ffree": 1 << 15,
                "f_namemax": 255}

    def access(self, path: str, amode: int) -> int:
        with self._mutex:
            self._check()
            self._ino(path, None)
            return 0

    def utimens(self, path: str | None, times: Any = None, fh: int | None = None) -> int:
        with self._mutex:
            self._check()
            self._ino(path, fh)
            return 0

    # ---------------------------------------------------------------- not simulated
    def fallocate(self, path: str | None, mode: int, offset: int, size: int,
                  fh: int | None) -> int:
        raise _err(errno.EOPNOTSUPP)

    def chmod(self, path: str | None, mode: int) -> int:
        raise _err(errno.EOPNOTSUPP)

    def chown(self, path: str | None, uid: int, gid: int) -> int:
        raise _err(errno.EOPNOTSUPP)

    def symlink(self, target: str, source: str) -> int:
        raise _err(errno.EOPNOTSUPP)

    def readlink(self, path: str) -> str:
        raise _err(errno.EINVAL)

    def mknod(self, path: str, mode: int, dev: int) -> int:
        raise _err(errno.EOPNOTSUPP)

    def setxattr(self, *args: Any) -> int:
        raise _err(errno.EOPNOTSUPP)

    def getxattr(self, *args: Any) -> bytes:
        raise _err(errno.ENODATA)

    def listxattr(self, *args: Any) -> list[str]:
        return []

    def removexattr(self, *args: Any) -> int:
        raise _err(errno.EOPNOTSUPP)

    def ioctl(self, *args: Any) -> int:
        raise _err(errno.ENOTTY)


class _Fuse(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy's FUSE, passing rename's flags on (mfusepy 3.1 drops them)."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return int(self.operations.rename(old.decode(self.encoding, self.errors),
                                          new.decode(self.encoding, self.errors), flags))


def _control(ops: SimDisk) -> None:
    """Answer the commands on standard input (see the module's doc)."""
    for line in sys.stdin:
        words = line.split()
        try:
            if not words:
                continue
            if words[0] == "reset":
                with ops._mutex:
                    ops.reset()
            elif words[0] == "cut":
                with ops._mutex:
                    ops.frozen = True
                    with open(words[1], "wb") as f:
                        pickle.dump(ops.dump(), f)
            elif words[0] == "drop_sync":
                with ops._mutex:
                    ops.drop_sync_at = ops.fsyncs + int(words[1])
            else:
                raise ValueError(f"unknown command {words[0]!r}")
            print("ok", flush=True)
        except Exception as exc:  # noqa: BLE001 - reported to the controller
            print(f"error {exc!r}", flush=True)


def main() -> None:
    """Mount at ``sys.argv[1]`` in the foreground until unmounted."""
    ops = SimDisk()
    threading.Thread(target=_control, args=(ops,), daemon=True).start()
    _Fuse(ops, sys.argv[1], foreground=True, nothreads=True, hard_remove=True,
          attr_timeout=0, entry_timeout=0, negative_timeout=0, fsname="simdisk")


if __name__ == "__main__":
    main()

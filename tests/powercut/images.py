"""Crash images: what a disk could hold after a power cut, from a :mod:`simfs` dump.

Kinds:

- ``durable``: only what fsync and directory fsync made durable;
- ``prefix``: that plus a random prefix of the later operations, in order (a
  filesystem whose journal commits in order);
- ``pages``: that plus a random prefix of the later namespace operations and a
  random subset of the unsynced 4 KiB pages of every file, its size either the
  durable one or the one processes saw, with the pages past the durable size
  written when the larger size persisted (torn and reordered writes within the
  committed size, ext4 ``data=ordered``);
- ``zeros``: every namespace operation, every file at the size processes saw, but
  its bytes past what was fsynced zeros (a filesystem that persists a file's new
  size before its data: XFS, ext4 ``data=writeback``).
"""

from __future__ import annotations

import os
import random
from typing import Any

PAGE = 4096
KINDS = ("durable", "prefix", "pages", "zeros")

State = tuple[dict[int, dict[str, int]], dict[int, bytes]]


def _apply(entries: dict[int, dict[str, int]], data: dict[int, bytes],
           op: tuple[Any, ...]) -> None:
    if op[0] == "ns":
        _, _, d, name, ino = op
        names = entries.setdefault(d, {})
        if ino is None:
            names.pop(name, None)
        else:
            names[name] = ino
    elif op[0] == "w":
        _, ino, off, b = op
        buf = bytearray(data.get(ino, b""))
        if off > len(buf):
            buf.extend(bytes(off - len(buf)))
        buf[off:off + len(b)] = b
        data[ino] = bytes(buf)
    else:
        _, ino, size = op
        old = data.get(ino, b"")
        data[ino] = old[:size] + bytes(max(0, size - len(old)))


def _group_prefix(pending: list[tuple[Any, ...]], k: int) -> list[tuple[Any, ...]]:
    """The first ``k`` operations, extended so no rename is half applied."""
    while 0 < k < len(pending) and pending[k][0] == "ns" and pending[k - 1][0] == "ns" \
            and pending[k][1] == pending[k - 1][1]:
        k += 1
    return pending[:k]


def make_image(dump: dict[str, Any], kind: str, rng: random.Random) -> State:
    """The names and the file contents of one crash image of ``kind``."""
    entries = {d: dict(e) for d, e in dump["durable_entries"].items()}
    data = dict(dump["durable_data"])
    pending: list[tuple[Any, ...]] = dump["pending"]
    if kind == "durable":
        return entries, data
    if kind == "prefix":
        for op in _group_prefix(pending, rng.randint(0, len(pending))):
            _apply(entries, data, op)
        return entries, data
    ns = [op for op in pending if op[0] == "ns"]
    if kind == "pages":
        for op in _group_prefix(ns, rng.randint(0, len(ns))):
            _apply(entries, data, op)
    else:
        for op in ns:
            _apply(entries, data, op)
    dirty: dict[int, set[int]] = {}
    for op in pending:
        if op[0] == "w":
            _, ino, off, b = op
            dirty.setdefault(ino, set()).update(range(off // PAGE, (off + len(b) - 1) // PAGE + 1))
        elif op[0] == "t":
            dirty.setdefault(op[1], set())
    for ino, pages in dirty.items():
        old = data.get(ino, b"")
        new = dump["visible_data"].get(ino, b"")
        if kind == "zeros":
            data[ino] = old[:len(new)] + bytes(max(0, len(new) - len(old)))
            continue
        size = rng.choice((len(old), len(new)))
        buf = bytearray(old[:size] + bytes(max(0, size - len(old))))
        for p in pages:
            lo = p * PAGE
            if lo >= size:
                continue
            # Past the durable size the larger size persisted only with its data
            # (data=ordered); within it, each page is old or new.
            if lo + PAGE > len(old) or rng.random() < 0.5:
                chunk = new[lo:lo + PAGE]
                hi = min(size, lo + len(chunk))
                buf[lo:hi] = chunk[:hi - lo]
        data[ino] = bytes(buf)
    return entries, data


def materialize(state: State, kinds: dict[int, str], root: str) -> None:
    """Write ``state`` as real files under ``root`` (which must not exist)."""
    entries, data = state
    os.makedirs(root)
    placed: dict[int, str] = {}

    def walk(d: int, path: str) -> None:
        for name, ino in sorted(entries.get(d, {}).items()):
            p = os.path.join(path, name)
            if kinds.get(ino) == "d":
                os.mkdir(p)
                walk(ino, p)
            elif ino in placed:
                os.link(placed[ino], p)
            else:
                with open(p, "wb") as f:
                    f.write(data.get(ino, b""))
                placed[ino] = p

    walk(1, root)

"""A Spark write's commit makes durable, before the queue depends on it, every change it
makes to the queue's files (found by the power cuts of ``tests/test_powercut.py``)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.layout import Layout
from aiodiskqueue.spark._staging import StagedWriter, link

pytestmark = pytest.mark.spark


def rec(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


async def test_the_torn_tail_a_commit_cuts_is_fsynced_before_the_segment_stops_being_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A crash left a torn record at the end of the last segment; the commit cuts it and
    # appends segments after it. Unless the cut is durable before the renames are, a
    # power cut can bring the torn bytes back in a segment that is no longer the last:
    # damage there, and the segment, with acknowledged records, quarantined.
    lay = Layout(str(tmp_path), "q")
    seg0 = rec(b"alpha") + rec(b"beta")
    Path(lay.segment_path(0)).write_bytes(seg0 + struct.pack(">I", 300) + b"torn")
    staged = tmp_path / "staged"
    staged.mkdir()
    w = StagedWriter(str(staged), 4096)
    w.write([b"gamma", b"delta"])
    files = w.close()

    events: list[tuple[str, str]] = []
    real_fsync, real_rename, real_truncate = os.fsync, os.rename, os.truncate
    real_ftruncate = os.ftruncate

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: str, dst: str) -> None:
        events.append(("rename", dst))
        real_rename(src, dst)

    def truncate(path: str, size: int) -> None:
        events.append(("truncate", os.path.realpath(path)))
        real_truncate(path, size)

    def ftruncate(fd: int, size: int) -> None:
        events.append(("truncate", os.readlink(f"/proc/self/fd/{fd}")))
        real_ftruncate(fd, size)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "truncate", truncate)
    monkeypatch.setattr(os, "ftruncate", ftruncate)
    link(lay, files, 0, 1 << 20)
    monkeypatch.undo()

    seg0_path = os.path.realpath(lay.segment_path(0))
    assert ("truncate", seg0_path) in events
    cut = events.index(("truncate", seg0_path))
    first_rename = next(i for i, e in enumerate(events) if e[0] == "rename")
    assert ("fsync", seg0_path) in events[cut:first_rename], events
    assert Path(seg0_path).stat().st_size == len(seg0)
    async with DiskQueue(tmp_path, "q") as q:
        assert [await q.get() for _ in range(q.qsize())] == [b"alpha", b"beta", b"gamma",
                                                             b"delta"]

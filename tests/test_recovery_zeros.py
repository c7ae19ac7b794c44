"""Zero-filled tails: a filesystem that persists a file's new size before its data
(XFS, ext4 ``data=writeback``) leaves zeros past the last fsync after a power cut.
Every 4 zero bytes parse as an empty record; recovery must not deliver them."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.meta import Meta


def rec(payload: bytes) -> bytes:
    """One go-diskqueue record."""
    return struct.pack(">I", len(payload)) + payload


def lay(directory: Path) -> Layout:
    return Layout(str(directory), "q")


def write_files(directory: Path, segments: dict[int, bytes], meta: Meta | None) -> None:
    """Segments and meta exactly as given (``meta`` None: no meta file)."""
    lo = lay(directory)
    for num, data in segments.items():
        Path(lo.segment_path(num)).write_bytes(data)
    if meta is not None:
        Path(lo.meta_path).write_bytes(meta.encode())


async def drain(directory: Path) -> list[bytes]:
    async with DiskQueue(directory, "q") as q:
        return [await q.get() for _ in range(q.qsize())]


ZEROS = bytes(4 * 300 + 2)  # 300 "empty records" and 2 bytes of a torn one


@pytest.mark.parametrize("with_meta", [True, False], ids=["tail-past-meta", "no-meta"])
async def test_zero_filled_tail_is_cut(tmp_path: Path, with_meta: bool,
                                       caplog: pytest.LogCaptureFixture) -> None:
    synced = rec(b"alpha") + rec(b"beta")  # 9 + 8 bytes: the meta's write position is 17
    write_files(tmp_path, {0: synced + rec(b"gamma") + ZEROS},
                Meta(2, 0, 0, 0, len(synced)) if with_meta else None)
    with caplog.at_level(logging.WARNING, logger="aiodiskqueue"):
        assert await drain(tmp_path) == [b"alpha", b"beta", b"gamma"]
    assert "zero-filled tail" in caplog.text
    # cut off on disk: 17 + 9 bytes of records remain
    assert Path(lay(tmp_path).segment_path(0)).stat().st_size == len(synced) + 9
    assert await drain(tmp_path) == []


async def test_whole_new_segment_of_zeros_is_cut(tmp_path: Path) -> None:
    # A roll fsyncs segment 0; segment 1 was created and grown, its data never written.
    seg0 = rec(b"one") + rec(b"two")
    write_files(tmp_path, {0: seg0, 1: bytes(4096)}, Meta(2, 0, 0, 0, len(seg0)))
    assert await drain(tmp_path) == [b"one", b"two"]


async def test_known_empty_messages_are_kept(tmp_path: Path) -> None:
    # An empty record before a non-empty one past the write position: this queue
    # holds empty messages, so the trailing ones are real.
    synced = rec(b"alpha")
    tail = rec(b"") + rec(b"x") + rec(b"") + rec(b"")
    write_files(tmp_path, {0: synced + tail}, Meta(1, 0, 0, 0, len(synced)))
    assert await drain(tmp_path) == [b"alpha", b"", b"x", b"", b""]


async def test_an_empty_message_earlier_in_the_segment_vouches_for_the_tail(
        tmp_path: Path) -> None:
    # A process killed after its empty puts were fsynced, before a meta store covered
    # them: an empty record the meta covers shows this queue holds empty messages.
    covered = rec(b"x") + rec(b"") + rec(b"y")
    write_files(tmp_path, {0: covered + rec(b"") + rec(b"")}, Meta(3, 0, 0, 0, len(covered)))
    assert await drain(tmp_path) == [b"x", b"", b"y", b"", b""]


async def test_a_consumed_empty_message_vouches_for_the_tail(tmp_path: Path) -> None:
    covered = rec(b"x") + rec(b"")  # both read before the crash
    write_files(tmp_path, {0: covered + rec(b"")}, Meta(0, 0, len(covered), 0, len(covered)))
    assert await drain(tmp_path) == [b""]


async def test_empty_messages_ending_a_completed_segment_are_kept(tmp_path: Path) -> None:
    # A completed segment was fsynced at its roll: its trailing empty records are real.
    seg0 = rec(b"a") + rec(b"") + rec(b"")
    seg1 = rec(b"b")
    write_files(tmp_path, {0: seg0, 1: seg1}, Meta(1, 0, 0, 0, 5))
    assert await drain(tmp_path) == [b"a", b"", b"", b"b"]


async def test_empty_messages_before_the_write_position_are_kept(tmp_path: Path) -> None:
    # Covered by the meta: written and synced, whatever bytes they are.
    data = rec(b"a") + rec(b"") + rec(b"")
    write_files(tmp_path, {0: data}, Meta(3, 0, 0, 0, len(data)))
    assert await drain(tmp_path) == [b"a", b"", b""]


async def test_zeros_then_garbage_are_cut_and_saved(tmp_path: Path) -> None:
    # Part of the unsynced tail reached the disk, part did not: zeros, then bytes that
    # do not make a record. Neither is delivered; the bytes are kept in a .bad file.
    synced = rec(b"alpha")
    write_files(tmp_path, {0: synced + bytes(4096) + b"\xff" * 100},
                Meta(1, 0, 0, 0, len(synced)))
    assert await drain(tmp_path) == [b"alpha"]
    assert len(lay(tmp_path).bad_files()) == 1


async def test_queue_put_after_a_cut_tail(tmp_path: Path) -> None:
    synced = rec(b"alpha")
    write_files(tmp_path, {0: synced + bytes(64)}, Meta(1, 0, 0, 0, len(synced)))
    async with DiskQueue(tmp_path, "q") as q:
        await q.put(b"after")
        assert [await q.get() for _ in range(q.qsize())] == [b"alpha", b"after"]

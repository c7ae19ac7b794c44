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


def mark(directory: Path) -> None:
    """The empty-message marker a queue makes before it accepts an empty message."""
    Path(lay(directory).empty_marker_path).touch()


async def test_with_the_marker_trailing_empty_messages_are_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Empty puts fsynced (sync_every=1) before a meta store covered them: the marker
    # says this queue holds empty messages, so they are messages, silently.
    synced = rec(b"alpha")
    mark(tmp_path)
    write_files(tmp_path, {0: synced + rec(b"") + rec(b"")}, Meta(1, 0, 0, 0, len(synced)))
    with caplog.at_level(logging.WARNING, logger="aiodiskqueue"):
        assert await drain(tmp_path) == [b"alpha", b"", b""]
    assert caplog.text == ""


async def test_with_the_marker_a_zero_filled_tail_reads_as_empty_messages(
        tmp_path: Path) -> None:
    # The cost of the rule, documented: a queue that holds empty messages cannot tell
    # a zero-filled tail from them (the format has no checksum).
    mark(tmp_path)
    write_files(tmp_path, {0: rec(b"a") + bytes(12)}, Meta(1, 0, 0, 0, 5))
    assert await drain(tmp_path) == [b"a", b"", b"", b""]


async def test_without_the_marker_earlier_empty_records_vouch_for_nothing(
        tmp_path: Path) -> None:
    # Empty records the meta covers, or one before non-empty records past it, do not
    # make a trailing run real: only the marker does (a queue writes it before its
    # first empty message; these files were written by something else).
    covered = rec(b"x") + rec(b"") + rec(b"y")
    tail = rec(b"") + rec(b"z") + rec(b"") + rec(b"")
    write_files(tmp_path, {0: covered + tail}, Meta(3, 0, 0, 0, len(covered)))
    assert await drain(tmp_path) == [b"x", b"", b"y", b"", b"z"]


@pytest.mark.parametrize("with_meta", [True, False], ids=["tail-past-meta", "no-meta"])
async def test_min_msg_size_a_zero_filled_tail_is_cut_not_quarantined(
        tmp_path: Path, with_meta: bool, caplog: pytest.LogCaptureFixture) -> None:
    # min_msg_size=1: a zero length is invalid, but zeros to the end of the last
    # segment are what a power cut leaves, not damage: cut with the same warning.
    synced = rec(b"alpha")
    write_files(tmp_path, {0: synced + rec(b"beta") + bytes(4096 + 2)},
                Meta(1, 0, 0, 0, len(synced)) if with_meta else None)
    with caplog.at_level(logging.WARNING, logger="aiodiskqueue"):
        async with DiskQueue(tmp_path, "q", min_msg_size=1) as q:
            assert [await q.get() for _ in range(q.qsize())] == [b"alpha", b"beta"]
    assert "zero-filled tail" in caplog.text
    assert lay(tmp_path).bad_files() == []
    assert Path(lay(tmp_path).segment_path(0)).stat().st_size == len(synced) + 8


async def test_min_msg_size_zeros_then_garbage_are_damage(tmp_path: Path) -> None:
    synced = rec(b"alpha")
    write_files(tmp_path, {0: synced + bytes(4096) + b"\xff" * 100},
                Meta(1, 0, 0, 0, len(synced)))
    async with DiskQueue(tmp_path, "q", min_msg_size=1) as q:
        assert [await q.get() for _ in range(q.qsize())] == [b"alpha"]
    assert len(lay(tmp_path).bad_files()) == 1


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

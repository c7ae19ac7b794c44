"""Opening a queue whose files were left by a crash: missing, unparsable or stale
meta, torn tails, consumed leftovers. State is rebuilt from the segments."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from helpers_format import (
    MetaText,
    bad_files,
    layout,
    meta_name,
    patch_bytes,
    read_meta,
    read_queue,
    seg_name,
    segment_numbers,
    write_queue,
)

from aiodiskqueue import DiskQueue


def msgs_of(n: int, start: int = 0) -> list[bytes]:
    """Messages of 5..24 bytes, each naming its index."""
    return [b"m%04d" % i + b"." * (i % 20) for i in range(start, start + n)]


async def drain(directory: Path, name: str = "q", **opts: Any) -> tuple[list[bytes], int]:
    """Open, take everything, close; return the messages and the recovered count."""
    async with DiskQueue(directory, name, **opts) as q:
        recovered = q.statistics().recovered
        got = [await q.get() for _ in range(q.qsize())]
    return got, recovered


@pytest.mark.parametrize("consumed", [0, 37], ids=["from-file-0", "consumed-files-deleted"])
async def test_missing_meta_rebuilt_from_segments(tmp_path: Path, consumed: int,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    msgs = msgs_of(120)
    written = write_queue(tmp_path, "q", msgs, 200, consumed=consumed, meta=False)
    assert not (tmp_path / meta_name("q")).exists()
    # Without a meta, every record of the remaining files is unread (at-least-once).
    files, _ = layout(msgs, 200)
    expected = [m for n in sorted(files) if n >= written.read_file for m in _records(files[n])]
    with caplog.at_level(logging.WARNING, logger="aiodiskqueue"):
        got, _ = await drain(tmp_path, max_bytes_per_file=200)
    assert got == expected
    assert expected[-1] == msgs[-1] and len(expected) >= len(msgs) - consumed
    assert any("no meta file" in r.getMessage() for r in caplog.records)
    assert bad_files(tmp_path) == []


def _records(data: bytes) -> list[bytes]:
    out, off = [], 0
    while off < len(data):
        n = int.from_bytes(data[off:off + 4], "big", signed=True)
        out.append(data[off + 4:off + 4 + n])
        off += 4 + n
    return out


@pytest.mark.parametrize("garbage", [b"", b"hello\n", b"5\n0,0\n", b"\xff" * 30,
                                     b"3\n2,0\n1,0\n"],
                         ids=["empty-file", "text", "short", "binary", "read-past-write"])
async def test_unparsable_meta_rebuilt_from_segments(tmp_path: Path, garbage: bytes) -> None:
    msgs = msgs_of(60)
    write_queue(tmp_path, "q", msgs, 150)
    (tmp_path / meta_name("q")).write_bytes(garbage)
    got, _ = await drain(tmp_path, max_bytes_per_file=150)
    assert got == msgs
    assert (tmp_path / (meta_name("q") + ".bad")).read_bytes() == garbage
    assert read_queue(tmp_path, "q") == []


async def test_a_second_unparsable_meta_never_overwrites_the_first(tmp_path: Path) -> None:
    write_queue(tmp_path, "q", msgs_of(3), 150)
    bad = tmp_path / (meta_name("q") + ".bad")
    bad.write_bytes(b"the first bad meta")
    (tmp_path / meta_name("q")).write_bytes(b"the second")
    got, _ = await drain(tmp_path, max_bytes_per_file=150)
    assert got == msgs_of(3)
    assert bad.read_bytes() == b"the first bad meta"
    assert (tmp_path / (meta_name("q") + ".bad.1")).read_bytes() == b"the second"


@pytest.mark.parametrize(
    ("synced", "total"),
    [(0, 1), (5, 6), (10, 40), (33, 90), (0, 90)],
    ids=["none-synced-1", "one-behind", "stale-same-and-later-files", "stale-many-files",
         "never-synced"],
)
async def test_stale_meta_tail_recovered(tmp_path: Path, synced: int, total: int) -> None:
    # The meta was last stored after `synced` puts; the process then put `total` in all
    # and was killed. go-diskqueue would skip to a new file and orphan the rest.
    msgs = msgs_of(total)
    write_queue(tmp_path, "q", msgs, 100)
    _, (wf, wp) = layout(msgs[:synced], 100)
    (tmp_path / meta_name("q")).write_bytes(MetaText(synced, 0, 0, wf, wp).encode())
    got, recovered = await drain(tmp_path, max_bytes_per_file=100)
    assert got == msgs
    assert recovered == total - synced
    assert bad_files(tmp_path) == []


@pytest.mark.parametrize("torn", [1, 3, 4, 9], ids=lambda t: f"{t}B-torn")
async def test_torn_tail_truncated_and_appended_after(tmp_path: Path, torn: int,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    msgs = msgs_of(12)
    write_queue(tmp_path, "q", msgs, 1000)
    last = tmp_path / seg_name("q", 0)
    good_size = last.stat().st_size
    partial = (b"\0\0\0\x10" + b"p" * 16)[:torn]  # a 20-byte record cut after `torn` bytes
    with last.open("ab") as f:
        f.write(partial)
    with caplog.at_level(logging.WARNING, logger="aiodiskqueue"):
        async with DiskQueue(tmp_path, "q", max_bytes_per_file=1000) as q:
            assert last.stat().st_size == good_size  # truncated on open
            assert q.qsize() == 12
            await q.put(b"after")
            await q.sync()
            assert last.read_bytes()[good_size:] == b"\0\0\0\x05after"
            assert [await q.get() for _ in range(13)] == [*msgs, b"after"]
    assert any("torn tail" in r.getMessage() for r in caplog.records)


async def test_torn_tail_past_stale_meta_in_later_file(tmp_path: Path) -> None:
    msgs = msgs_of(30)
    write_queue(tmp_path, "q", msgs, 100)
    _, (wf, _) = layout(msgs, 100)
    assert wf >= 2
    (tmp_path / meta_name("q")).write_bytes(MetaText(0, 0, 0, 0, 0).encode())
    with (tmp_path / seg_name("q", wf)).open("ab") as f:
        f.write(b"\0\0\0\x40abc")  # 7 bytes of a 68-byte record
    got, recovered = await drain(tmp_path, max_bytes_per_file=100)
    assert got == msgs and recovered == 30
    assert bad_files(tmp_path) == []


async def test_meta_write_pos_beyond_file_end(tmp_path: Path) -> None:
    # The meta promises more bytes than the write file has (e.g. lost without fsync):
    # whatever whole records exist are delivered, nothing is invented.
    msgs = msgs_of(20)
    write_queue(tmp_path, "q", msgs, 1000)
    path = tmp_path / seg_name("q", 0)
    keep = sum(4 + len(m) for m in msgs[:15])
    os.truncate(path, keep + 2)
    got, _ = await drain(tmp_path, max_bytes_per_file=1000)
    assert got == msgs[:15]
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=1000) as q:
        await q.put(b"next")
        assert await q.get() == b"next"


async def test_consumed_leftover_segments_removed(tmp_path: Path) -> None:
    # A crash between storing the meta and deleting the files it moved past.
    msgs = msgs_of(50)
    write_queue(tmp_path, "q", msgs, 100)
    meta = write_queue(tmp_path / "ref", "q", msgs, 100, consumed=30)
    (tmp_path / meta_name("q")).write_bytes(meta.encode())
    assert segment_numbers(tmp_path, "q")[0] == 0 < meta.read_file
    got, _ = await drain(tmp_path, max_bytes_per_file=100)
    assert got == msgs[30:]
    assert segment_numbers(tmp_path, "q") in ([], [read_meta(tmp_path, "q").write_file])


async def test_missing_middle_segment(tmp_path: Path) -> None:
    msgs = msgs_of(40)
    write_queue(tmp_path, "q", msgs, 100)
    files, _ = layout(msgs, 100)
    os.remove(tmp_path / seg_name("q", 2))
    lost = set(_records(files[2]))
    got, _ = await drain(tmp_path, max_bytes_per_file=100)
    assert got == [m for m in msgs if m not in lost]


async def test_negative_depth_in_meta_is_recounted(tmp_path: Path) -> None:
    msgs = msgs_of(10)
    meta = write_queue(tmp_path, "q", msgs, 1000, consumed=4)
    bogus = MetaText(-3, meta.read_file, meta.read_pos, meta.write_file, meta.write_pos)
    (tmp_path / meta_name("q")).write_bytes(bogus.encode())
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=1000) as q:
        assert q.qsize() == 6
        assert [await q.get() for _ in range(6)] == msgs[4:]


async def test_wrong_depth_in_meta_does_not_drift(tmp_path: Path) -> None:
    msgs = msgs_of(10)
    meta = write_queue(tmp_path, "q", msgs, 1000)
    (tmp_path / meta_name("q")).write_bytes(
        MetaText(99, 0, 0, meta.write_file, meta.write_pos).encode())
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=1000) as q:
        assert [await q.get() for _ in range(10)] == msgs
        # Everything on disk has been read: the queue knows it is empty.
        assert q.qsize() == 0 and q.empty()


async def test_reopen_many_times_keeps_order(tmp_path: Path) -> None:
    expected: list[bytes] = []
    got: list[bytes] = []
    for round_ in range(8):
        async with DiskQueue(tmp_path, "q", max_bytes_per_file=64) as q:
            new = msgs_of(7, start=round_ * 7)
            await q.put_many(new)
            expected += new
            for _ in range(5):
                got.append(await q.get())
    assert got == expected[: len(got)]
    assert read_queue(tmp_path, "q") == expected[len(got):]


async def test_meta_write_pos_inside_a_record_destroys_nothing(tmp_path: Path) -> None:
    # A damaged meta whose write position points into the middle of a record: scanning
    # from there finds garbage, which must not be taken for a torn tail and truncated.
    msgs = msgs_of(10)
    meta = write_queue(tmp_path, "q", msgs, 1000)
    size = (tmp_path / seg_name("q", 0)).stat().st_size
    inside = sum(4 + len(m) for m in msgs[:6]) + 3  # 3 bytes into record 6
    (tmp_path / meta_name("q")).write_bytes(
        MetaText(6, 0, 0, meta.write_file, inside).encode())
    got, _ = await drain(tmp_path, max_bytes_per_file=1000)
    assert got == msgs
    assert bad_files(tmp_path) == []
    assert (tmp_path / seg_name("q", 0)).stat().st_size == size


async def test_meta_write_file_too_low_and_inside_a_record(tmp_path: Path) -> None:
    msgs = msgs_of(40)
    write_queue(tmp_path, "q", msgs, 100)
    files, (wf, _) = layout(msgs, 100)
    assert wf >= 3
    # Claims file 1 is the write file, at an offset inside its second record.
    inside = 4 + len(_records(files[1])[0]) + 2
    (tmp_path / meta_name("q")).write_bytes(MetaText(3, 0, 0, 1, inside).encode())
    got, _ = await drain(tmp_path, max_bytes_per_file=100)
    assert got == msgs
    assert bad_files(tmp_path) == []


@pytest.mark.parametrize("same_file", [True, False], ids=["read-in-write-file",
                                                          "read-in-earlier-file"])
async def test_meta_read_pos_inside_a_record_redelivers_it(tmp_path: Path,
                                                           same_file: bool) -> None:
    msgs = msgs_of(30)
    max_bytes = 10_000 if same_file else 100
    meta = write_queue(tmp_path, "q", msgs, max_bytes)
    files, _ = layout(msgs, max_bytes)
    first = _records(files[0])
    assert len(first) >= 3 and (same_file == (meta.write_file == 0))
    inside = 4 + len(first[0]) + 4 + 5  # 5 bytes into the payload of record 1 of file 0
    (tmp_path / meta_name("q")).write_bytes(
        MetaText(28, 0, inside, meta.write_file, meta.write_pos).encode())
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=max_bytes) as q:
        got: list[bytes] = []
        while not got or got[-1] != msgs[-1]:
            got.append(await asyncio.wait_for(q.get(), 10))
        await q.sync()
        assert q.qsize() == 0
    # Record 1 holds the position: it comes again; nothing is skipped or quarantined.
    assert got == msgs[1:]
    assert bad_files(tmp_path) == []


@pytest.mark.parametrize("same_file", [True, False], ids=["read-in-write-file",
                                                          "read-in-earlier-file"])
@pytest.mark.parametrize("damaged", [0, 2], ids=["first-record", "third-record"])
async def test_damage_before_the_read_position_loses_nothing_after_it(
        tmp_path: Path, same_file: bool, damaged: int) -> None:
    # A consumed record of the read segment is damaged: its length now runs past the
    # end of the file, so the records from the segment's start no longer reach the
    # meta's read position. That position is still a record boundary and the records
    # after it are whole: all of them come, and nothing is quarantined.
    msgs = msgs_of(30)
    max_bytes = 10_000 if same_file else 100
    consumed = 3
    meta = write_queue(tmp_path, "q", msgs, max_bytes, consumed=consumed)
    assert meta.read_pos > 0 and (same_file == (meta.read_file == meta.write_file))
    path = tmp_path / seg_name("q", meta.read_file)
    at = sum(4 + len(m) for m in msgs[:damaged])
    patch_bytes(path, at, path.stat().st_size.to_bytes(4, "big"))
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=max_bytes) as q:
        assert q.qsize() == len(msgs) - consumed
        got = []
        with contextlib.suppress(TimeoutError):  # a lost record: qsize() never reached
            while q.qsize():
                got.append(await asyncio.wait_for(q.get(), 5))
    assert got == msgs[consumed:]
    assert bad_files(tmp_path) == []


@pytest.mark.parametrize("meta", ["missing", "stale"])
async def test_bad_length_in_last_file_tail_is_saved_not_lost(tmp_path: Path,
                                                              meta: str) -> None:
    # A bad length field in the part of the last file that recovery scans is damage,
    # not a torn write: the bytes from there are kept in a .bad file before the cut.
    msgs = msgs_of(12)
    write_queue(tmp_path, "q", msgs, 10_000, meta=meta == "stale")
    if meta == "stale":
        (tmp_path / meta_name("q")).write_bytes(MetaText(2, 0, 0, 0, 4 + len(msgs[0]) + 4 +
                                                         len(msgs[1])).encode())
    path = tmp_path / seg_name("q", 0)
    original = path.read_bytes()
    at = sum(4 + len(m) for m in msgs[:7])  # record 7's length field
    patch_bytes(path, at, (10**9).to_bytes(4, "big"))
    got, _ = await drain(tmp_path, max_bytes_per_file=10_000)
    assert got == msgs[:7]
    saved = tmp_path / (seg_name("q", 0) + ".bad")
    # Everything from the bad field on, so records 8.. can still be repaired by hand.
    assert saved.read_bytes() == (10**9).to_bytes(4, "big") + original[at + 4:]
    assert path.stat().st_size == at


async def test_leftover_meta_temp_files_removed(tmp_path: Path) -> None:
    msgs = msgs_of(3)
    write_queue(tmp_path, "q", msgs, 1000)
    mine = tmp_path / (meta_name("q") + ".4242.tmp")  # a store_meta() killed midway
    other = tmp_path / (meta_name("other") + ".4242.tmp")
    mine.write_bytes(b"3\n0,")
    other.write_bytes(b"")
    got, _ = await drain(tmp_path, max_bytes_per_file=1000)
    assert got == msgs
    assert not mine.exists() and other.exists()  # another queue's file is not ours


# ------------------------------------------------------------------ metas that contradict the files


def _rec(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def _files(directory: Path, segs: dict[int, bytes], meta: bytes | None) -> None:
    for num, data in segs.items():
        (directory / seg_name("q", num)).write_bytes(data)
    if meta is not None:
        (directory / meta_name("q")).write_bytes(meta)


async def _take_all(directory: Path, **opts: Any) -> tuple[list[bytes], int]:
    """Open, take every message (waiting a little for each), close."""
    async with DiskQueue(directory, "q", **opts) as q:
        got = []
        while q.qsize():
            got.append(await asyncio.wait_for(q.get(), 10))
        return got, q.statistics().bad_files


@pytest.mark.parametrize("meta", [b"3\n5,0\n5,0\n", b"3\n2,0\n2,0\n", b"0\n0,100\n1,0\n",
                                  b"9\n1,0\n7,0\n"],
                         ids=["both-past-the-files", "past-with-depth", "read-past-end",
                              "write-file-far-ahead"])
async def test_meta_that_contradicts_the_files_deletes_nothing(tmp_path: Path,
                                                               meta: bytes) -> None:
    # Segments 0 and 1 hold a, b and c; the meta cannot describe them.
    _files(tmp_path, {0: _rec(b"a") + _rec(b"b"), 1: _rec(b"c")}, meta)
    got, bad = await _take_all(tmp_path)
    assert got == [b"a", b"b", b"c"] and bad == 0


@pytest.mark.parametrize("meta", [b"3\n5,0\n5,0\n", b"0\n0,100\n1,0\n"])
async def test_meta_that_contradicts_the_files_is_corruption_in_strict_mode(
        tmp_path: Path, meta: bytes) -> None:
    from aiodiskqueue import CorruptionError

    _files(tmp_path, {0: _rec(b"a") + _rec(b"b"), 1: _rec(b"c")}, meta)
    with pytest.raises(CorruptionError, match="does not match the segments"):
        await DiskQueue.open(tmp_path, "q", strict=True)
    assert segment_numbers(tmp_path, "q") == [0, 1]
    assert (tmp_path / meta_name("q")).read_bytes() == meta


@pytest.mark.parametrize("meta", [b"3\n0,0\n1,5\n", b"0\n0,0\n0,0\n", None],
                         ids=["correct-meta", "stale-meta", "no-meta"])
async def test_intact_records_before_damage_are_delivered(tmp_path: Path,
                                                          meta: bytes | None) -> None:
    # Segment 0: a, b, then a length of -1 and junk; segment 1: c.
    seg0 = _rec(b"a") + _rec(b"b") + b"\xff\xff\xff\xff" + b"junkjunk"
    _files(tmp_path, {0: seg0, 1: _rec(b"c")}, meta)
    got, bad = await _take_all(tmp_path)
    assert got == [b"a", b"b", b"c"] and bad == 1
    saved = bad_files(tmp_path)
    assert len(saved) == 1 and (tmp_path / saved[0]).read_bytes().endswith(b"junkjunk")


async def test_read_position_past_the_files_is_not_a_write_position(tmp_path: Path) -> None:
    # The read position lies past the end of the last segment and the write file is
    # missing: taking it as the write position would extend the file to 10 GB.
    _files(tmp_path, {0: _rec(b"a")}, b"0\n0,10000000000\n1,0\n")
    async with DiskQueue(tmp_path, "q") as q:
        await asyncio.wait_for(q.put(b"b"), 10)
        assert [await q.get(), await q.get()] == [b"a", b"b"]
    assert all((tmp_path / seg_name("q", n)).stat().st_size < 100
               for n in segment_numbers(tmp_path, "q"))


@pytest.mark.parametrize("number", ["10000000000000000000", "18446744073709551616"])
async def test_meta_numbers_outside_int64_are_unreadable(tmp_path: Path, number: str) -> None:
    _files(tmp_path, {0: _rec(b"a")}, f"1\n0,0\n{number},7\n".encode())
    got, _ = await _take_all(tmp_path)
    assert got == [b"a"]
    assert (tmp_path / (meta_name("q") + ".bad")).exists()


async def test_depth_too_low_never_empty_nor_negative(tmp_path: Path) -> None:
    # 3000 messages on disk, a meta claiming 10, a read buffer holding ~200.
    msgs = msgs_of(3000)
    meta = write_queue(tmp_path, "q", msgs, 1 << 20)
    (tmp_path / meta_name("q")).write_bytes(
        MetaText(10, 0, 0, meta.write_file, meta.write_pos).encode())
    async with DiskQueue(tmp_path, "q", read_buffer_bytes=4096) as q:
        got: list[bytes] = []
        while len(got) < len(msgs):
            assert q.qsize() >= 1 and not q.empty()
            got.append(await asyncio.wait_for(q.get(), 10))
            assert q.qsize() == len(msgs) - len(got) or len(got) < 400
        assert got == msgs and q.qsize() == 0 and q.empty()

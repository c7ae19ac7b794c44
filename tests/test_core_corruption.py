"""Corruption found while the queue runs: damaged segments ahead of the reader are
quarantined as ``.bad`` with a warning naming file and offset, reading goes on with
the next file, and the depth is corrected."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest
from conftest import MakeQueue
from helpers_format import bad_files, layout, patch_bytes, read_queue, seg_name

# 1000-byte messages (1004-byte records), 3 per 3100-byte file; a 4 KiB read buffer
# keeps the reader about one file ahead, so later files are read only when needed.
SIZE = 1000
OPTS = {"max_bytes_per_file": 3100, "read_buffer_bytes": 4096, "min_msg_size": 10,
        "max_msg_size": 2000}


def big(i: int) -> bytes:
    """Message ``i``: 1000 bytes naming its index."""
    return (b"%05d" % i) * (SIZE // 5)


async def take(q: object, n: int) -> list[bytes]:
    """``n`` messages, each within 10 seconds."""
    from aiodiskqueue import DiskQueue

    assert isinstance(q, DiskQueue)
    return [await asyncio.wait_for(q.get(), 10) for _ in range(n)]


@pytest.mark.parametrize(
    ("damage", "offset", "kept"),
    [
        ("truncate", 2500, 2),  # 2 whole records, then 492 bytes of the third
        ("length=0", 1004, 1),  # second record's length 0 < min_msg_size
        ("length=-1", 2008, 2),  # third record's length negative
        ("length=huge", 0, 0),  # first record's length > max_msg_size
    ],
)
async def test_damaged_file_ahead_of_reader(make_queue: MakeQueue, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture, damage: str,
                                            offset: int, kept: int) -> None:
    msgs = [big(i) for i in range(15)]  # files 0..4, three records each
    q = await make_queue(**OPTS)
    await q.put_many(msgs)
    assert await q.get() == msgs[0]  # the reader is in file 0, file 3 not read yet
    path = tmp_path / seg_name("q", 3)
    if damage == "truncate":
        os.truncate(path, offset)
    else:
        value = {"length=0": 0, "length=-1": -1, "length=huge": 5000}[damage]
        patch_bytes(path, offset, value.to_bytes(4, "big", signed=True))
    with caplog.at_level(logging.WARNING, logger="aiodiskqueue"):
        got = await take(q, 9 + kept - 1 + 3)
    assert got == msgs[1:9] + msgs[9:9 + kept] + msgs[12:]
    st = q.statistics()
    assert st.bad_files == 1 and q.qsize() == 0
    assert bad_files(tmp_path) == [seg_name("q", 3) + ".bad"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and seg_name("q", 3) in warned[0]
    assert f"offset {offset if damage != 'truncate' else 2008}" in warned[0]
    await q.put(b"z" * 10)  # still usable
    assert await q.get() == b"z" * 10


async def test_several_damaged_files_and_bad_name_collisions(make_queue: MakeQueue,
                                                             tmp_path: Path) -> None:
    # An older quarantined copy of file 2 already exists: it is kept, the new one is .bad.1.
    (tmp_path / (seg_name("q", 2) + ".bad")).write_bytes(b"old")
    msgs = [big(i) for i in range(21)]  # files 0..6
    q = await make_queue(**OPTS)
    await q.put_many(msgs)
    assert await q.get() == msgs[0]
    for num in (2, 3, 5):
        patch_bytes(tmp_path / seg_name("q", num), 0, b"\xff\xff\xff\xff")
    got = await take(q, 2 + 3 + 3 + 3)
    assert got == msgs[1:6] + msgs[12:15] + msgs[18:21]  # files 0 (rest), 1, 4, 6
    assert q.qsize() == 0 and q.statistics().bad_files == 3
    assert bad_files(tmp_path) == sorted([seg_name("q", 2) + ".bad", seg_name("q", 2) + ".bad.1",
                                          seg_name("q", 3) + ".bad", seg_name("q", 5) + ".bad"])
    assert (tmp_path / (seg_name("q", 2) + ".bad")).read_bytes() == b"old"


async def test_depth_corrected_after_quarantine(make_queue: MakeQueue, tmp_path: Path) -> None:
    msgs = [big(i) for i in range(15)]
    q = await make_queue(**OPTS)
    await q.put_many(msgs)
    assert q.qsize() == 15
    assert await q.get() == msgs[0]
    os.remove(tmp_path / seg_name("q", 2))  # a whole file lost under the queue
    got = await take(q, 2)
    assert got == msgs[1:3]
    rest = []
    while q.qsize() > 0:
        rest.append(await asyncio.wait_for(q.get(), 10))
    assert rest == msgs[3:6] + msgs[9:]  # file 2 (msgs 6..8) is gone
    await q.sync()
    assert read_queue(tmp_path, "q") == []


async def test_damage_behind_the_reader_is_harmless(make_queue: MakeQueue,
                                                    tmp_path: Path) -> None:
    msgs = [big(i) for i in range(9)]
    q = await make_queue(**OPTS)
    await q.put_many(msgs)
    assert await take(q, 4) == msgs[:4]  # file 0 fully read, file 1 read into
    await q.sync()
    files, _ = layout(msgs, 3100)
    assert not (tmp_path / seg_name("q", 0)).exists()  # consumed and deleted
    patch_bytes(tmp_path / seg_name("q", 1), 0, b"\xff\xff\xff\xff")  # record 3: taken
    assert await take(q, 5) == msgs[4:]
    assert q.statistics().bad_files == 0 and len(files) == 3


async def test_quarantine_of_last_data_moves_read_position_past_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from aiodiskqueue import DiskQueue

    async with DiskQueue(tmp_path, "q", max_bytes_per_file=16, max_msg_size=1000) as q:
        await q.put(b"0000")
    patch_bytes(tmp_path / seg_name("q", 0), 0, b"\x01")  # length 0x01000004 > max_msg_size
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=16, max_msg_size=1000) as q:
        await q.sync()  # the read-ahead has quarantined file 0
        assert q.qsize() == 0 and q.statistics().bad_files == 1
        st = q.statistics()
        # Nothing unread lies before the write position: the consumer position is there.
        assert (st.read_file_num, st.read_pos) == (st.write_file_num, st.write_pos)
    # So the stored meta matches the files, and the next open needs no rebuild.
    caplog.clear()  # the quarantine above logged its own warning
    with caplog.at_level(logging.WARNING, logger="aiodiskqueue"):
        async with DiskQueue(tmp_path, "q", max_bytes_per_file=16, max_msg_size=1000) as q:
            assert q.qsize() == 0
    assert [r.getMessage() for r in caplog.records] == []

"""strict=True: damage raises CorruptionError and nothing is renamed, skipped or rebuilt."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers_format import meta_name, seg_name, write_queue

from aiodiskqueue import CorruptionError, DiskQueue


def msgs(n: int) -> list[bytes]:
    return [b"m%04d" % i for i in range(n)]  # 5 bytes: 9-byte records


async def test_bad_length_in_a_completed_file_raises_on_get_and_renames_nothing(
    tmp_path: Path,
) -> None:
    write_queue(tmp_path, "q", msgs(30), 90)  # 10 records (90 bytes) per file
    seg1 = tmp_path / seg_name("q", 1)
    data = bytearray(seg1.read_bytes())
    data[18:22] = (10**6).to_bytes(4, "big")  # third record of file 1: length 1e6
    seg1.write_bytes(bytes(data))
    damaged = seg1.read_bytes()
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=90, max_msg_size=100,
                         strict=True) as q:
        got = [await q.get() for _ in range(12)]
        assert got == msgs(12)
        with pytest.raises(CorruptionError) as info:
            await q.get()
        assert info.value.path == str(seg1)
        assert info.value.offset == 18
        with pytest.raises(CorruptionError):
            q.get_nowait()
        assert q.statistics().bad_files == 0
        await q.put(b"still")  # writing goes on
    assert [f for f in os.listdir(tmp_path) if ".bad" in f] == []
    assert seg1.read_bytes() == damaged  # left exactly as found, for repair or forensics


async def test_unreadable_meta_raises_on_open_and_is_left_alone(tmp_path: Path) -> None:
    write_queue(tmp_path, "q", msgs(5), 1000)
    (tmp_path / meta_name("q")).write_bytes(b"garbage\n")
    with pytest.raises(CorruptionError) as info:
        await DiskQueue.open(tmp_path, "q", strict=True)
    assert info.value.path.endswith(meta_name("q"))
    assert (tmp_path / meta_name("q")).read_bytes() == b"garbage\n"
    # Not strict: rebuilt from the segments.
    async with DiskQueue(tmp_path, "q") as q:
        assert [await q.get() for _ in range(5)] == msgs(5)


async def test_default_mode_quarantines_the_same_damage(tmp_path: Path) -> None:
    write_queue(tmp_path, "q", msgs(30), 90)
    seg1 = tmp_path / seg_name("q", 1)
    data = bytearray(seg1.read_bytes())
    data[18:22] = (10**6).to_bytes(4, "big")
    seg1.write_bytes(bytes(data))
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=90, max_msg_size=100) as q:
        got = [await q.get() for _ in range(22)]
        # File 1 is skipped whole: its two good records before the damage go with it.
        assert got == msgs(12) + msgs(30)[20:]
        assert q.statistics().bad_files == 1
        assert q.qsize() == 0
    assert (tmp_path / (seg_name("q", 1) + ".bad")).exists()

"""The ack log's space reserve: blocks allocated past its end, so a full disk can be drained.

The end-to-end case (a real full tmpfs, drained by an AckQueue) is in test_full_disk.py;
these check the mechanism itself on the test directory's filesystem, and a roll on a
real full tmpfs.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from helpers_fs import take_every_free_byte

from aiodiskqueue._format import space
from aiodiskqueue.ack import log as ack_log
from aiodiskqueue.ack.codec import done_record, entry_record, head_record
from aiodiskqueue.ack.log import AckLog, LogJob
from aiodiskqueue.ack.queue import AckQueue

RESERVE = 64 * 1024


def _allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


def _can_reserve(tmp_path: Path) -> bool:
    fd = os.open(tmp_path / "probe", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        return space.reserve_past_end(fd, 0, 4096) is True
    finally:
        os.close(fd)


def _write_until_refused(lg: AckLog, records: list[bytes]) -> None:
    for _ in range(10):
        lg.run(LogJob(records=records))


@pytest.fixture
def reserving_fs(tmp_path: Path) -> Path:
    if not _can_reserve(tmp_path):
        pytest.fail(f"the filesystem of {tmp_path} cannot allocate past a file's end "
                    "(Linux fallocate with FALLOC_FL_KEEP_SIZE); ext4, xfs, btrfs and tmpfs can")
    return tmp_path


def test_reserve_past_end_keeps_the_size_and_allocates_blocks(reserving_fs: Path) -> None:
    path = reserving_fs / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 100)
        assert space.reserve_past_end(fd, 100, RESERVE) is True
    finally:
        os.close(fd)
    assert path.stat().st_size == 100
    assert _allocated(str(path)) >= RESERVE


def test_the_log_keeps_a_reserve_past_its_end_and_tops_it_up(reserving_fs: Path) -> None:
    lg = AckLog(str(reserving_fs), "q", 1 << 20, RESERVE)
    lg.open()
    seg = lg.path(lg.active)
    assert _allocated(seg) >= RESERVE > lg.size
    # Writing most of the reserve tops it up again.
    big = [done_record(k, k) for k in range(1, 3000)]
    lg.run(LogJob(records=big))
    assert lg.size > RESERVE
    assert _allocated(seg) >= lg.size + RESERVE * 3 // 4
    lg.close()
    # A closed log keeps its reserve (a queue reopened on a full disk can be drained).
    assert _allocated(seg) >= lg.size + RESERVE * 3 // 4
    assert os.stat(seg).st_size == lg.size


def test_a_rolled_segment_gives_its_reserve_back(reserving_fs: Path) -> None:
    lg = AckLog(str(reserving_fs), "q", 8192, RESERVE)
    lg.open()
    first = lg.path(lg.active)
    lg.run(LogJob(records=[done_record(k, k) for k in range(1, 1000)]))
    assert lg.active > 0
    assert _allocated(first) < os.stat(first).st_size + 4096
    assert _allocated(lg.path(lg.active)) >= lg.size + RESERVE * 3 // 4
    lg.close()


def test_on_a_full_disk_the_last_half_of_the_reserve_is_kept_for_a_commit(
        reserving_fs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lg = AckLog(str(reserving_fs), "q", 1 << 20, RESERVE)
    lg.open()
    monkeypatch.setattr(ack_log, "reserve_past_end", lambda fd, off, n: False)  # disk full
    records = [done_record(k, k) for k in range(1, 400)]  # ~10 KiB each job
    with pytest.raises(OSError, match="kept for the next commit") as ei:
        _write_until_refused(lg, records)
    assert ei.value.errno == errno.ENOSPC
    size = lg.size
    assert size <= RESERVE // 2 + 64  # what was written stayed in the first half
    # A commit's records (with a head record) may use the rest.
    lg.run(LogJob(records=[*records, head_record(1, 1, 0, 0, 1)], sync=True))
    assert lg.size > size
    lg.close()
    # Nothing written was lost or cut: everything replays.
    again = AckLog(str(reserving_fs), "q", 1 << 20, RESERVE)
    rec = again.open()
    assert rec.cut_bytes == 0 and rec.commit == (1, 0, 0)
    again.close()


def test_the_reserve_is_a_share_of_a_data_segment_within_bounds() -> None:
    def reserve(**kw: object) -> int:
        return AckQueue("/nonexistent", "q", **kw)._pump.config.reserve_bytes  # type: ignore[arg-type]

    assert reserve() == 100 * 2**20 // 32
    assert reserve(max_bytes_per_file=64 * 1024) == 64 * 1024
    assert reserve(max_bytes_per_file=2**30) == 4 * 2**20
    assert reserve(max_bytes_per_file=2**30, log_segment_bytes=1 << 20) == 1 << 20


def test_on_a_full_disk_compaction_waits_and_commits_go_through(
        reserving_fs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lg = AckLog(str(reserving_fs), "q", 1 << 20, RESERVE)
    lg.open()
    live = lg.run(LogJob(records=[entry_record(1, 1, 0, 0, 1, b"0123456789abcdef",
                                               b"b" * 2000)])).locs[0]
    monkeypatch.setattr(ack_log, "reserve_past_end", lambda fd, off, n: False)  # disk full
    records = [done_record(k, k) for k in range(2, 400)]
    with pytest.raises(OSError, match="kept for the next commit"):
        _write_until_refused(lg, records)
    for i in range(4):  # each commit also plans a compaction copy of the live entry
        head = head_record(5, 5, 0, 0, 2)
        res = lg.run(LogJob(records=[done_record(1000 + i, 1000 + i), head],
                            copies=[(*live, 0, 1)], delete=[live[0]], sync=True))
        assert res.copy_locs == [live]  # not copied: it stays where it is, as its segment
    lg.close()
    rec = AckLog(str(reserving_fs), "q", 1 << 20, RESERVE).open()
    assert 1 in rec.entries and rec.commit == (5, 0, 0)


def test_a_roll_that_fails_after_creating_the_segment_loses_no_later_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lg = AckLog(str(tmp_path), "q", 4096, 0)
    lg.open()
    records = [done_record(k, k) for k in range(1, 60)]
    lg.run(LogJob(records=records))

    def full(self: AckLog) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(AckLog, "_flush_head", full)  # the new segment gets no head
        with pytest.raises(OSError, match="No space"):
            _write_until_refused(lg, records)
    assert lg.active == 1
    lg.run(LogJob(records=[entry_record(999, 999, 0, 0, 1, b"0123456789abcdef", b"x")],
                  sync=True))
    lg.close()
    rec = AckLog(str(tmp_path), "q", 4096, 0).open()
    assert rec.cut_bytes == 0
    assert 999 in rec.entries  # written after the failed roll, and read back


def _fill_and_steal_after_each_truncate(fs: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fill ``fs``; from now on, another writer takes every byte freed by a truncate.
    Returns the list of bytes taken, one entry per truncate."""
    take_every_free_byte(fs / "filler")
    real = os.ftruncate
    thefts: list[int] = []

    def ftruncate_and_steal(fd: int, size: int) -> None:
        real(fd, size)
        thefts.append(take_every_free_byte(fs / f"thief{len(thefts)}"))

    monkeypatch.setattr(os, "ftruncate", ftruncate_and_steal)
    return thefts


def test_a_roll_on_a_full_disk_keeps_the_reserve_for_the_commit(
        small_fs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer on the disk takes every block as soon as one is freed (here:
    after each truncate of the log). The log still takes a commit when its segment is
    full: the older segment keeps its reserve until the next one has its own."""
    lg = AckLog(str(small_fs), "q", 8192, RESERVE)
    lg.open()
    thefts = _fill_and_steal_after_each_truncate(small_fs, monkeypatch)
    records = [done_record(k, k) for k in range(1, 200)]  # ~5 KiB a job
    with pytest.raises(OSError, match="kept for the next commit"):
        _write_until_refused(lg, records)
    assert lg.active == 0 and lg.size > 8192  # no roll: grown past the segment size
    lg.run(LogJob(records=[head_record(7, 7, 0, 0, 200)], sync=True))
    monkeypatch.undo()
    lg.close()
    assert sum(thefts) == 0  # nothing was given back while the disk was full
    rec = AckLog(str(small_fs), "q", 8192, RESERVE).open()
    assert rec.cut_bytes == 0 and rec.commit == (7, 0, 0)


def test_a_hop_past_the_segment_size_on_a_full_disk_keeps_out_of_the_commit_half(
        small_fs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hop that crosses the segment size when no next segment can be reserved: its
    records would reach into the half of the reserve kept for the commit, so the hop
    is refused before anything is written, and the reserve stays whole."""
    lg = AckLog(str(small_fs), "q", 8192, RESERVE)
    lg.open()
    seg = lg.path(lg.active)
    lg.run(LogJob(records=[done_record(k, k) for k in range(1, 300)]))  # just under 8 KiB
    thefts = _fill_and_steal_after_each_truncate(small_fs, monkeypatch)
    size, allocated = lg.size, _allocated(seg)
    big = [done_record(k, k) for k in range(1000, 3400)]  # ~60 KiB
    with pytest.raises(OSError, match="kept for the next commit"):
        lg.run(LogJob(records=big))
    assert lg.size == size and lg.active == 0 and thefts == []
    assert _allocated(seg) == allocated > size + RESERVE // 2  # the reserve is whole
    lg.run(LogJob(records=[*big[:100], head_record(7, 7, 0, 0, 1100)], sync=True))
    monkeypatch.undo()
    lg.close()
    rec = AckLog(str(small_fs), "q", 8192, RESERVE).open()
    assert rec.cut_bytes == 0 and rec.commit == (7, 0, 0)


def test_an_empty_last_segment_left_by_a_crash_is_removed_at_open(tmp_path: Path) -> None:
    lg = AckLog(str(tmp_path), "q", 4096, 0)
    lg.open()
    lg.run(LogJob(records=[done_record(k, k) for k in range(1, 300)], sync=True))
    lg.run(LogJob(records=[head_record(9, 9, 0, 0, 300)], sync=True))
    last = lg.active
    lg.close()
    open(lg.path(last + 1), "wb").close()  # a roll that crashed before its head record
    again = AckLog(str(tmp_path), "q", 4096, 0)
    rec = again.open()
    assert not os.path.exists(lg.path(last + 1)) and again.active == last
    assert rec.commit == (9, 0, 0) and last + 1 not in rec.sizes
    again.close()


def test_an_empty_first_segment_left_by_a_crash_gets_its_head_at_open(tmp_path: Path) -> None:
    lg = AckLog(str(tmp_path), "q", 4096, 0)
    open(lg.path(0), "wb").close()  # a new log whose head record never made it
    lg.open()
    assert lg.size > 0  # the head record
    lg.close()
    assert os.path.getsize(lg.path(0)) == lg.size

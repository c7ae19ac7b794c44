"""The file layer under the Spark data source (no SparkSession needed): views, limits,
consuming, staged writes and linking, checked against the core ``DiskQueue``."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path

import pytest
from conftest import CopyFixture
from helpers_format import fixture_msg, oversize_msg

from aiodiskqueue import DiskQueue, QueueLocked
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.lock import QueueLock
from aiodiskqueue._format.meta import load_meta
from aiodiskqueue.spark._consume import release
from aiodiskqueue.spark._files import spans_between, view_queue
from aiodiskqueue.spark._ranges import advance
from aiodiskqueue.spark._staging import (
    STALE_SECONDS,
    StagedFile,
    StagedWriter,
    committed_batch,
    link,
    owner_alive,
    owner_line,
    process_start_time,
    sweep_staging,
)

pytestmark = pytest.mark.spark

MAX = 1 << 20


async def drain(directory: Path, name: str) -> list[bytes]:
    out: list[bytes] = []
    async with DiskQueue(directory, name, max_msg_size=MAX) as q:
        while not q.empty():
            # A depth too high would block get() forever: fail instead of hanging.
            out.append(await asyncio.wait_for(q.get(), 30))
        assert q.statistics().bad_files == 0
    return out


def stage(tmp_path: Path, payloads: list[bytes], max_bytes: int = 1024) -> list[StagedFile]:
    w = StagedWriter(str(tmp_path / "staging"), max_bytes, owner_line())
    w.write(payloads)
    return w.close()


def append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def segment_bytes(directory: Path, name: str) -> list[bytes]:
    lay = Layout(str(directory), name)
    return [Path(p).read_bytes() for _, p in sorted(lay.segments().items())]


async def test_staged_files_match_what_diskqueue_writes(tmp_path: Path) -> None:
    items = [fixture_msg(i) for i in range(300)] + [b"z" * 1500, b"", b"a"]
    async with DiskQueue(tmp_path / "core", "q", max_bytes_per_file=1024) as q:
        await q.put_many(items)
    files = stage(tmp_path, items)
    assert [Path(f.path).read_bytes() for f in files] == segment_bytes(tmp_path / "core", "q")
    assert sum(f.records for f in files) == len(items)


@pytest.mark.parametrize("name", ["fixture", "empty", "emptied", "oversize"])
async def test_link_appends_after_go_fixture(copy_fixture: CopyFixture, tmp_path: Path,
                                             name: str) -> None:
    qdir = tmp_path / "q"
    copy_fixture(name, qdir)
    old = {"fixture": [fixture_msg(i) for i in range(137, 1000)],
           "oversize": [oversize_msg(i) for i in range(9)]}.get(name, [])
    new = [b"new-%d" % i for i in range(100)]
    meta = link(Layout(str(qdir), name), stage(tmp_path, new, 300), 0, MAX)
    assert meta is not None and meta.depth == len(old) + len(new)
    assert not list((tmp_path / "staging").glob("*.dat"))  # every staged file was linked
    assert await drain(qdir, name) == old + new


async def test_link_keeps_recovered_tail_and_drops_torn_record(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=64) as q:
        await q.put_many([b"old-%d" % i for i in range(5)])
    lay = Layout(str(tmp_path), "q")
    meta = load_meta(lay.meta_path)
    assert meta is not None
    # Written after the last meta sync by a process that then died mid-record:
    # 2 whole records (4+6 bytes each) and 7 bytes of a torn one.
    append(lay.segment_path(meta.write_file_num),
           b"\x00\x00\x00\x06tail-0\x00\x00\x00\x06tail-1\x00\x00\x00\x06tai")
    link(lay, stage(tmp_path, [b"new-0", b"new-1"]), 0, MAX)
    assert await drain(tmp_path, "q") == (
        [b"old-%d" % i for i in range(5)] + [b"tail-0", b"tail-1", b"new-0", b"new-1"])


def test_link_replayed_batch_is_skipped(tmp_path: Path) -> None:
    lay = Layout(str(tmp_path / "q"), "q")
    assert link(lay, stage(tmp_path, [b"a"]), 0, MAX, ("w", 0)) is not None
    assert link(lay, stage(tmp_path, [b"b"]), 0, MAX, ("w", 1)) is not None
    assert link(lay, stage(tmp_path, [b"b"]), 0, MAX, ("w", 1)) is None
    assert link(lay, stage(tmp_path, [b"c"]), 0, MAX, ("other", 0)) is not None
    assert committed_batch(lay, "w") == 1 and committed_batch(lay, "other") == 0
    meta = load_meta(lay.meta_path)
    assert meta is not None and meta.depth == 3


def test_link_to_locked_queue_names_queue_and_pid(tmp_path: Path) -> None:
    lay = Layout(str(tmp_path), "held")
    lock = QueueLock(lay.lock_path)
    lock.acquire()
    try:
        files = stage(tmp_path, [b"x"])
        with pytest.raises(QueueLocked, match=rf"append to queue 'held'.*process {os.getpid()}"):
            link(lay, files, 0, MAX, lock_wait=0.2)
        assert Path(files[0].path).exists()  # the caller's abort removes it
        assert not Path(lay.meta_path).exists()
    finally:
        lock.release()


async def test_release_consumes_and_deletes_segments(tmp_path: Path) -> None:
    items = [b"r%03d" % i for i in range(100)]  # 8 bytes per record
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=80) as q:
        await q.put_many(items)
    lay = Layout(str(tmp_path), "q")
    view = view_queue(lay, 0, MAX)
    pos, rows, nbytes = advance(view, view.spans, 35, None, 0, MAX)
    # 35 records: files 0..2 hold 10 each, so the position is 5 records into file 3.
    assert (pos, rows, nbytes) == ((3, 40), 35, 280)
    assert pos is not None
    assert release(lay, pos, 0, MAX) is True
    assert release(lay, pos, 0, MAX) is False  # idempotent
    assert min(lay.segments()) == 3
    meta = load_meta(lay.meta_path)
    assert meta is not None and meta.depth == 65 and meta.read == (3, 40)
    assert await drain(tmp_path, "q") == items[35:]


async def test_advance_moves_a_file_end_to_the_next_file(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=80) as q:
        await q.put_many([b"r%03d" % i for i in range(30)])
    view = view_queue(Layout(str(tmp_path), "q"), 0, MAX)
    assert advance(view, view.spans, 10, None, 0, MAX)[0] == (1, 0)
    assert advance(view, view.spans, None, 85, 0, MAX)[:2] == ((1, 0), 10)
    assert advance(view, view.spans, None, None, 0, MAX)[:2] == ((2, 80), 30)
    assert advance(view, [], 5, None, 0, MAX) == (None, 0, 0)


async def test_spans_between_reports_a_vanished_segment(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=80) as q:
        await q.put_many([b"r%03d" % i for i in range(30)])
    lay = Layout(str(tmp_path), "q")
    view = view_queue(lay, 0, MAX)
    spans, lost = spans_between(view, (0, 40), (2, 16))
    assert [(s.num, s.start, s.stop) for s in spans] == [(0, 40, 80), (1, 0, 80), (2, 0, 16)]
    assert lost == []
    os.remove(lay.segment_path(1))
    view = view_queue(lay, 0, MAX)
    assert view.missing == (1,)
    spans, lost = spans_between(view, (0, 40), (2, 16))
    assert [(s.num, s.start, s.stop) for s in spans] == [(0, 40, 80), (2, 0, 16)]
    assert lost == [((1, 0), (2, 0))]


def test_sweep_removes_only_stale_staging(tmp_path: Path) -> None:
    lay = Layout(str(tmp_path), "q")
    parent = tmp_path / ".spark-staging" / "q"
    (parent / "old-job").mkdir(parents=True)
    (parent / "old-job" / "x.dat").write_bytes(b"stale")
    (parent / "new-job").mkdir()
    old = os.stat(parent / "old-job").st_mtime - STALE_SECONDS - 10
    os.utime(parent / "old-job", (old, old))
    sweep_staging(lay)
    assert sorted(p.name for p in parent.iterdir()) == ["new-job"]


def test_link_waits_for_a_short_lived_holder(tmp_path: Path) -> None:
    lay = Layout(str(tmp_path / "q"), "q")
    os.makedirs(lay.directory)
    lock = QueueLock(lay.lock_path)
    lock.acquire()
    # Another commit holding the lock for a moment: the link retries until it is free.
    timer = threading.Timer(0.2, lock.release)
    timer.start()
    try:
        meta = link(lay, stage(tmp_path, [b"x", b"y"]), 0, MAX, lock_wait=30.0)
    finally:
        timer.join()
    assert meta is not None and meta.depth == 2
    assert not lock.held


def test_staged_writer_creates_its_directory_only_with_an_owner(tmp_path: Path) -> None:
    where = tmp_path / "job"
    with pytest.raises(FileNotFoundError):
        StagedWriter(str(where), 1024).write([b"x"])  # a batch task of an ended job
    w = StagedWriter(str(where), 1024, owner_line())
    w.write([b"x"])
    assert [f.records for f in w.close()] == [1]
    # The owner file names this process's driver, which is alive: a sweep keeps it.
    assert (where / "owner").read_text() == owner_line()
    assert owner_alive(str(where)) is True
    assert [p.name for p in where.iterdir() if not p.name.endswith(".dat")] == ["owner"]
    # A restarted stream takes over the directory its killed driver left.
    (where / "owner").write_text(f"{socket.gethostname()} {os.getpid()} 0\n")
    assert owner_alive(str(where)) is False
    StagedWriter(str(where), 1024, owner_line()).write([b"y"])
    assert owner_alive(str(where)) is True


def test_sweep_removes_jobs_of_dead_drivers_and_end_marks(tmp_path: Path) -> None:
    lay = Layout(str(tmp_path), "q")
    parent = tmp_path / ".spark-staging" / "q"
    me = f"{socket.gethostname()} {os.getpid()}"
    for job, owner in [("dead", f"{me} 0"), ("live", f"{me} {process_start_time(os.getpid())}"),
                       ("elsewhere", f"other-host {os.getpid()} 1")]:
        (parent / job).mkdir(parents=True)
        (parent / job / "owner").write_text(owner + "\n")
        (parent / job / "x.dat").write_bytes(b"staged")
    (parent / "old.ended").write_bytes(b"")
    sweep_staging(lay)
    # A pid whose start time differs is another process: that driver is gone.
    assert sorted(p.name for p in parent.iterdir()) == ["elsewhere", "live"]

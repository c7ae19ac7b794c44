"""Planning of the ``diskqueue`` source without a SparkSession: record ranges inside a
segment, one directory listing per trigger, drained queues, held queues, removal.

The reader classes are plain Python objects; these tests call them as Spark's
driver would, so they need pyspark importable but start no JVM.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.lock import QueueLock
from aiodiskqueue._format.meta import Meta, load_meta, store_meta
from aiodiskqueue.spark import _files
from aiodiskqueue.spark._errors import DataLoss, PathNotFound
from aiodiskqueue.spark._files import FileSpan, iter_records, view_queue
from aiodiskqueue.spark._options import OptionError, check_use, parse_options
from aiodiskqueue.spark._ranges import advance, iter_blocks, split_span
from aiodiskqueue.spark._reader import DiskQueueReader, QueuePartition, read_partition
from aiodiskqueue.spark._stream import DiskQueueStreamReader

pytestmark = pytest.mark.spark

MAX = 1 << 20


async def fill(directory: Path, name: str, items: list[bytes], **options: Any) -> None:
    async with DiskQueue(directory, name, max_msg_size=MAX, **options) as q:
        await q.put_many(items)


def options(path: Path, name: str, **extra: str) -> Any:
    return parse_options({"path": str(path), "name": name, **extra})


def sequential(layout: Layout, spans: list[FileSpan]) -> list[tuple[int, int, bytes]]:
    """``(file_num, offset, payload)`` of every record, read front to back."""
    return [(num, end - 4 - len(p), p)
            for recs in iter_records(layout, spans, 0, MAX) for p, num, end in recs]


def rows_of(opts: Any, parts: list[QueuePartition]) -> list[tuple[str, int, int, bytes]]:
    out = []
    for part in parts:
        for batch in read_partition(opts, part):
            d = batch.to_pydict()
            out += list(zip(d["name"], d["file_num"], d["offset"], d["payload"], strict=True))
    return out


# ------------------------------------------------------------------ ranges in a segment


@pytest.mark.parametrize("pieces", [2, 3, 8, 50])
def test_split_span_covers_every_record_once(tmp_path: Path, pieces: int) -> None:
    rng = random.Random(pieces)
    items = [bytes([i % 251]) * rng.choice([0, 1, 7, 100, 3000, 70_000]) for i in range(600)]
    asyncio.run(fill(tmp_path, "q", items, max_bytes_per_file=1 << 30))
    lay = Layout(str(tmp_path), "q")
    view = view_queue(lay, 0, MAX)
    (span,) = view.spans
    parts = split_span(lay, span, -(-span.size // pieces), 0, MAX)
    assert len(parts) == pieces
    assert parts[0].start == span.start and parts[-1].stop == span.stop
    assert all(a.stop == b.start for a, b in itertools.pairwise(parts))
    want = sequential(lay, [span])
    assert [(n, o, p) for n, o, p in sequential(lay, parts)] == want
    # The Arrow path reads each piece from its own first boundary, in small blocks too.
    got = []
    for part in parts:
        for block in iter_blocks(lay, part, 0, MAX, chunk=4096):
            got += [(part.num, block.base + s) for s in block.starts[:-1]]
    assert got == [(n, o) for n, o, _ in want]


@pytest.mark.parametrize("seed", range(4))
def test_runs_of_equal_records_walk_like_one_by_one(tmp_path: Path, seed: int) -> None:
    # Runs of one size (walked in strided slices) between runs of other sizes, with
    # payloads that look like length fields, read in blocks that cut runs anywhere.
    rng = random.Random(seed)
    items: list[bytes] = []
    while len(items) < 3000:
        size = rng.choice([0, 1, 4, 8, 12, 100, 333])
        fill_byte = rng.choice([b"\x00", b"\x0c", b"x"])
        items += [fill_byte * size] * rng.choice([1, 2, 3, 50, 400])
    asyncio.run(fill(tmp_path, "q", items, max_bytes_per_file=1 << 30))
    lay = Layout(str(tmp_path), "q")
    (span,) = view_queue(lay, 0, MAX).spans
    want = sequential(lay, [span])
    assert [p for _, _, p in want] == items
    for chunk in (64, 4096, 1 << 20):
        got = [(span.num, b.base + s) for b in iter_blocks(lay, span, 0, MAX, chunk=chunk)
               for s in b.starts[:-1]]
        assert got == [(n, o) for n, o, _ in want]
    for pieces in (2, 7, 40):
        parts = split_span(lay, span, -(-span.size // pieces), 0, MAX)
        assert all(a.stop == b.start for a, b in itertools.pairwise(parts))
        assert sequential(lay, parts) == want
    ends = [o + 4 + len(p) for _, o, p in want]
    view = view_queue(lay, 0, MAX)
    for max_rows, max_bytes in ((1, None), (777, None), (None, 5000), (40, 900),
                                (None, 1), (5000, None)):
        k = nbytes = 0
        for p in items:
            if k and ((max_rows is not None and k >= max_rows) or
                      (max_bytes is not None and nbytes + 4 + len(p) > max_bytes)):
                break
            k += 1
            nbytes += 4 + len(p)
        assert advance(view, view.spans, max_rows, max_bytes, 0, MAX) == (
            (0, ends[k - 1]), k, nbytes)


def test_batch_plan_min_partitions_splits_one_segment(tmp_path: Path) -> None:
    items = [b"%09d" % i + b"x" * 91 for i in range(20_000)]
    asyncio.run(fill(tmp_path, "big", items, max_bytes_per_file=1 << 30))
    opts = options(tmp_path, "big", minPartitions="8")
    parts = DiskQueueReader(opts).partitions()
    assert len(parts) == 8
    rows = rows_of(opts, parts)
    assert [r[3] for r in rows] == items
    lay = Layout(str(tmp_path), "big")
    assert [(r[1], r[2]) for r in rows] == [(n, o) for n, o, _ in
                                           sequential(lay, view_queue(lay, 0, MAX).spans)]


def test_each_read_of_one_segment_is_cut_by_its_own_options(tmp_path: Path) -> None:
    items = [b"%09d" % i + b"x" * 91 for i in range(20_000)]  # 2,080,000 bytes
    asyncio.run(fill(tmp_path, "big", items, max_bytes_per_file=1 << 30))
    lay = Layout(str(tmp_path), "big")
    want = [(n, o) for n, o, _ in sequential(lay, view_queue(lay, 0, MAX).spans)]
    # One process plans all of them, as one SparkSession's driver would: the cuts of an
    # earlier read must not decide a later one's.
    for extra, count in [({}, 1), ({"minPartitions": "8"}, 8),
                         ({"maxBytesPerPartition": "200000"}, 11),
                         ({"minPartitions": "3"}, 3), ({"minPartitions": "8"}, 8)]:
        opts = options(tmp_path, "big", **extra)
        parts = DiskQueueReader(opts).partitions()
        assert len(parts) == count, extra
        rows = rows_of(opts, parts)
        assert [r[3] for r in rows] == items, extra
        assert [(r[1], r[2]) for r in rows] == want, extra


# ------------------------------------------------------------------ loud on mistakes


def test_missing_path_and_no_matching_queue(tmp_path: Path) -> None:
    with pytest.raises(PathNotFound, match=r"\[PATH_NOT_FOUND\].*'.*nope' does not exist"):
        DiskQueueReader(options(tmp_path / "nope", "q"))
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(PathNotFound, match=r"is not a directory"):
        DiskQueueStreamReader(options(tmp_path / "file", "q"))
    with pytest.raises(PathNotFound, match=r"holds no queue matching 'ev-\*'.*name='ev-\*'"):
        DiskQueueReader(options(tmp_path, "ev-*"))
    with pytest.raises(PathNotFound, match=r"holds no queue matching 'q'"):
        DiskQueueStreamReader(options(tmp_path, "q", consume="true")).initialOffset()


def test_unknown_option_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"option 'maxRecordPerTrigger' is unknown; did you "
                                          r"mean 'maxRecordsPerTrigger'\? valid options: "
                                          r"path, name, .*maxRecordsPerTrigger"):
        options(tmp_path, "q", maxRecordPerTrigger="10")


@pytest.mark.parametrize(("typed", "shown"), [
    ("maxrecordpertrigger", "maxRecordPerTrigger"),  # as Spark hands over maxRecordPerTrigger
    ("minpartition", "minPartition"),
    ("max_record_per_trigger", "max_record_per_trigger"),
    ("MaxRecordPerTrigger", "MaxRecordPerTrigger"),  # a caller that kept the case
    ("colour", "colour"),
])
def test_unknown_option_is_spelled_as_typed(tmp_path: Path, typed: str, shown: str) -> None:
    with pytest.raises(OptionError, match=rf"^diskqueue: option '{shown}' is unknown; ") as info:
        parse_options({"path": str(tmp_path), "name": "q", typed: "10"})
    assert info.value.option == shown


def test_misplaced_option_is_spelled_as_documented(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"^diskqueue: option 'maxRecordsPerTrigger' does "
                                          r"not apply to a batch read"):
        check_use({"path": str(tmp_path), "maxrecordspertrigger": "5"}, "batch read")
    with pytest.raises(OptionError, match=r"^diskqueue: option 'consume' does not apply"):
        check_use({"consume": "true"}, "batch read")


def test_missing_middle_segment_is_data_loss(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    items = [b"m%04d" % i for i in range(300)]
    asyncio.run(fill(tmp_path, "q", items, max_bytes_per_file=900))
    lay = Layout(str(tmp_path), "q")
    os.remove(lay.segment_path(1))
    with pytest.raises(DataLoss, match=r"data loss in queue 'q': the records between "
                                       r"positions \[1, 0\] to \[2, 0\] are gone.*"
                                       r"failOnDataLoss=false.*python -m aiodiskqueue repair"):
        DiskQueueReader(options(tmp_path, "q")).partitions()
    opts = options(tmp_path, "q", failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, "aiodiskqueue.spark"):
        rows = rows_of(opts, DiskQueueReader(opts).partitions())
    per_file = 900 // 9
    assert [r[3] for r in rows] == items[:per_file] + items[2 * per_file:]
    assert "skipping them (failOnDataLoss=false)" in caplog.text


# ------------------------------------------------------------------ many queues


def drained_queues(directory: Path, count: int) -> None:
    for k in range(count):
        lay = Layout(str(directory), f"ev-{k:04d}")
        with open(lay.segment_path(0), "wb") as f:
            f.write(b"\x00\x00\x00\x01x")
        with open(lay.meta_path, "wb") as f:
            f.write(b"0\n0,5\n0,5\n")


def live_beside_drained(directory: Path, drained: int) -> tuple[DiskQueueStreamReader, Any]:
    """A consuming stream over one live queue of 100 records beside ``drained`` drained
    ones; the reader and its initial offset."""
    drained_queues(directory, drained)
    asyncio.run(fill(directory, "ev-live", [b"l%03d" % i for i in range(100)]))
    reader = DiskQueueStreamReader(options(directory, "ev-*", consume="true"))
    return reader, reader.initialOffset()


def test_one_listing_per_trigger_and_drained_queues_cost_no_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader, start = live_beside_drained(tmp_path, 200)
    assert list(start) == ["ev-live"]  # drained queues stay out of the offsets
    end = reader.latestOffset(start, ReadMaxRows(40))
    reader.partitions(start, end)
    reader.commit(end)

    scans: list[str] = []
    metas: list[str] = []
    real_scandir, real_load = os.scandir, load_meta

    def counting_scandir(p: str) -> Any:
        scans.append(p)
        return real_scandir(p)

    def counting_load(p: str) -> Any:
        metas.append(p)
        return real_load(p)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    monkeypatch.setattr(os, "listdir", lambda p: pytest.fail(f"listdir({p})"))
    monkeypatch.setattr(_files, "load_meta", counting_load)
    nxt = reader.latestOffset(end, ReadMaxRows(40))
    reader.reportLatestOffset()  # Spark's order within a trigger
    reader.partitions(end, nxt)
    assert scans == [str(tmp_path)]
    assert metas == [Layout(str(tmp_path), "ev-live").meta_path]  # the one that changed
    assert nxt == {"ev-live": [0, 80 * 8]}


class _CountingEntries:
    """``os.scandir`` whose entries count their ``stat()`` calls by file name."""

    def __init__(self, real: Any, stats: list[str]) -> None:
        self._real, self._stats = real, stats

    def __enter__(self) -> _CountingEntries:
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.close()

    def __iter__(self) -> Any:
        for entry in self._real:
            yield _CountingEntry(entry, self._stats)


class _CountingEntry:
    def __init__(self, entry: Any, stats: list[str]) -> None:
        self._entry, self._stats = entry, stats
        self.name, self.path = entry.name, entry.path

    def inode(self) -> int:
        return int(self._entry.inode())

    def stat(self) -> Any:
        self._stats.append(self.name)
        return self._entry.stat()


def test_settled_drained_queue_costs_one_stat_and_release_lists_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader, start = live_beside_drained(tmp_path, 50)
    first = reader.latestOffset(start, ReadMaxRows(10))
    reader.partitions(start, first)
    second = reader.latestOffset(first, ReadMaxRows(10))  # releases ``first``
    reader.partitions(first, second)

    stats: list[str] = []
    real_scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p: _CountingEntries(real_scandir(p), stats))
    monkeypatch.setattr(os, "listdir", lambda p: pytest.fail(f"listdir({p})"))
    third = reader.latestOffset(second, ReadMaxRows(10))  # releases ``second`` too
    reader.reportLatestOffset()
    assert third == {"ev-live": [0, 30 * 8]}
    meta = load_meta(Layout(str(tmp_path), "ev-live").meta_path)
    assert meta is not None and meta.read == (0, 20 * 8) and meta.depth == 80
    drained = [n for n in stats if not n.startswith("ev-live.")]
    # One stat per drained queue (its segment); its meta is known by its inode.
    assert sorted(drained) == [Layout(str(tmp_path), f"ev-{k:04d}").segment_path(0)
                               .rsplit("/", 1)[1] for k in range(50)]


def test_settled_drained_queue_sees_new_records(tmp_path: Path) -> None:
    drained_queues(tmp_path, 3)
    reader = DiskQueueStreamReader(options(tmp_path, "ev-*", consume="true"))
    start = reader.initialOffset()
    assert start == {}
    for _ in range(2):
        assert reader.latestOffset(start, ReadAllAvailable()) == {}
    # A writer that died before storing its meta: a whole record past the meta's end.
    with open(Layout(str(tmp_path), "ev-0001").segment_path(0), "ab") as f:
        f.write(b"\x00\x00\x00\x02ab")
    assert reader.latestOffset(start, ReadAllAvailable()) == {"ev-0001": [0, 11]}
    # A DiskQueue writing to another one (it stores its meta on close).
    asyncio.run(fill(tmp_path, "ev-0002", [b"cd"]))
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"ev-0001": [0, 11], "ev-0002": [0, 11]}
    rows = rows_of(reader.options, list(reader.partitions(start, end)))  # type: ignore[arg-type]
    assert sorted(r[3] for r in rows) == [b"ab", b"cd"]


def test_a_drained_queue_whose_holder_died_is_read_past_its_meta(tmp_path: Path) -> None:
    drained_queues(tmp_path, 1)
    lay = Layout(str(tmp_path), "ev-0000")
    holder = QueueLock(lay.lock_path)
    holder.acquire()
    # The holder appends a record and dies before storing its meta: no file changes after.
    with open(lay.segment_path(0), "ab") as f:
        f.write(b"\x00\x00\x00\x02ab")
    reader = DiskQueueStreamReader(options(tmp_path, "ev-*", consume="true"))
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == {}  # held: up to its meta
    holder.release()
    for _ in range(2):
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {"ev-0000": [0, 11]}
    rows = rows_of(reader.options, list(reader.partitions(start, end)))  # type: ignore[arg-type]
    assert [r[3] for r in rows] == [b"ab"]


def test_small_queues_share_partitions(tmp_path: Path) -> None:
    for k in range(60):
        asyncio.run(fill(tmp_path, f"ev-{k:03d}", [b"q%03d-%d" % (k, i) for i in range(10)]))
    reader = DiskQueueStreamReader(options(tmp_path, "ev-*", consume="true",
                                           minPartitions="1", maxBytesPerPartition="2000"))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    # 60 x 10 records of 10 bytes = 6,000 bytes: 3 partitions, not 60.
    assert len(parts) == 3
    assert all(isinstance(p, QueuePartition) for p in parts)
    rows = rows_of(reader.options, list(parts))  # type: ignore[arg-type]
    assert sorted(r[3] for r in rows) == sorted(b"q%03d-%d" % (k, i)
                                                for k in range(60) for i in range(10))


async def test_held_queue_takes_no_share_of_the_trigger_and_warns_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    await fill(tmp_path, "ev-a", [b"a%03d" % i for i in range(100)])
    await fill(tmp_path, "ev-b", [b"b%03d" % i for i in range(100)])
    holder = QueueLock(Layout(str(tmp_path), "ev-a").lock_path)
    holder.acquire()
    try:
        reader = DiskQueueStreamReader(options(tmp_path, "ev-*", consume="true"))
        start = reader.initialOffset()
        with caplog.at_level(logging.WARNING, "aiodiskqueue.spark"):
            end = reader.latestOffset(start, ReadMaxRows(100))
            again = reader.latestOffset(start, ReadMaxRows(100))
        # ev-b gets the whole budget; ev-a stays where it was.
        assert end == again == {"ev-a": [0, 0], "ev-b": [0, 800]}
        assert caplog.text.count("cannot consume queue 'ev-a'") == 1
    finally:
        holder.release()


def test_drained_queue_removal_after_retention(tmp_path: Path) -> None:
    drained_queues(tmp_path, 3)
    asyncio.run(fill(tmp_path, "ev-unread", [b"u"]))
    old = time.time() - 3600
    for p in tmp_path.iterdir():
        os.utime(p, (old, old))
    held = QueueLock(Layout(str(tmp_path), "ev-0001").lock_path)
    held.acquire()
    try:
        off = DiskQueueStreamReader(options(tmp_path, "ev-*", consume="true"))
        off.latestOffset(off.initialOffset(), ReadAllAvailable())
        assert len(list(tmp_path.glob("ev-0000.*"))) == 2  # default: never removed
        reader = DiskQueueStreamReader(options(tmp_path, "ev-*", consume="true",
                                               removeDrainedAfter="600"))
        start = reader.initialOffset()
        reader.latestOffset(start, ReadAllAvailable())
    finally:
        held.release()
    assert not list(tmp_path.glob("ev-0000.*")) and not list(tmp_path.glob("ev-0002.*"))
    assert Layout(str(tmp_path), "ev-0001").segments()  # held: kept
    meta = load_meta(Layout(str(tmp_path), "ev-unread").meta_path)
    assert meta is not None and meta.depth == 1  # unread data: kept


def test_failed_data_loss_names_what_is_gone_in_a_stream(tmp_path: Path) -> None:
    asyncio.run(fill(tmp_path, "q", [b"s%03d" % i for i in range(100)], max_bytes_per_file=200))
    reader = DiskQueueStreamReader(options(tmp_path, "q"))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(10))
    for num in (0, 1):
        os.remove(Layout(str(tmp_path), "q").segment_path(num))
    fresh = DiskQueueStreamReader(options(tmp_path, "q"))
    with pytest.raises(DataLoss, match=r"positions \[0, 0\] to \[0, 80\] are gone"):
        fresh.partitions(start, end)
    lenient = DiskQueueStreamReader(options(tmp_path, "q", failOnDataLoss="false"))
    assert lenient.partitions(start, end) == []
    nxt = lenient.latestOffset(end, ReadMaxRows(10))
    assert nxt == {"q": [2, 80]}  # from the oldest record still there


def torn_queue(directory: Path, stale_meta: bool = False) -> list[bytes]:
    """Queue ``q`` of 3,000 records in three segments, the last record of segment 1 cut
    short by 3 bytes (a torn record at byte 9,990 of a completed segment); returns the
    2,999 whole records. With ``stale_meta`` the meta's write position is at the end of
    segment 0, as after a crash before its next store: segment 1 is then read as tail."""
    items = [b"t%05d" % i for i in range(3000)]  # 10 bytes a record, 1,000 a segment
    asyncio.run(fill(directory, "q", items, max_bytes_per_file=10_000))
    lay = Layout(str(directory), "q")
    assert sorted(lay.segments()) == [0, 1, 2]
    seg = lay.segment_path(1)
    os.truncate(seg, os.path.getsize(seg) - 3)
    if stale_meta:
        store_meta(lay.meta_path, Meta(1000, 0, 0, 0, 10_000))
    return items[:1999] + items[2000:]


def read_all(opts: Any) -> list[bytes]:
    """Payloads of a whole batch read with ``opts``, Arrow batches or tuples."""
    out: list[bytes] = []
    for part in DiskQueueReader(opts).partitions():
        for got in read_partition(opts, part):
            if isinstance(got, tuple):
                out.append(got[3])
            else:
                out += got.column("payload").to_pylist()
    return out


@pytest.mark.parametrize("stale_meta", [False, True], ids=["indexed", "tail"])
@pytest.mark.parametrize("arrow", ["true", "false"], ids=["arrow", "tuples"])
def test_torn_record_in_a_completed_segment_is_data_loss(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, arrow: str, stale_meta: bool) -> None:
    whole = torn_queue(tmp_path, stale_meta)
    seg = Layout(str(tmp_path), "q").segment_path(1)
    with pytest.raises(DataLoss, match=(
            rf"^diskqueue: data loss in queue 'q': {re.escape(seg)} is a completed segment "
            r"\(a later one follows\) but its last 7 byte\(s\), from byte 9990, are not a "
            r"whole record: a torn record, the file is damaged\. To go on without them, set "
            r"the option failOnDataLoss=false .*"
            rf"'python -m aiodiskqueue repair {re.escape(str(tmp_path))} q' saves them")):
        read_all(options(tmp_path, "q", arrow=arrow))
    with caplog.at_level(logging.WARNING, logger="aiodiskqueue.spark"):
        got = read_all(options(tmp_path, "q", arrow=arrow, failOnDataLoss="false"))
    assert got == whole
    assert f"{seg} is a completed segment" in caplog.text
    assert "skipping the rest of this file (failOnDataLoss=false)" in caplog.text


def test_torn_record_in_a_completed_segment_agrees_with_verify_diskqueue_and_repair(
        tmp_path: Path) -> None:
    whole = torn_queue(tmp_path / "q")
    verify = subprocess.run([sys.executable, "-m", "aiodiskqueue", "verify",
                             str(tmp_path / "q"), "q"], capture_output=True, text=True)
    assert verify.returncode == 1 and "torn tail" in verify.stdout, verify.stdout
    # DiskQueue delivers the same records, and quarantines the torn bytes.
    shutil.copytree(tmp_path / "q", tmp_path / "copy")

    async def drain() -> tuple[list[bytes], int]:
        async with DiskQueue(tmp_path / "copy", "q") as q:
            out = []
            while not q.empty():
                # A depth too high would block get() forever: fail instead of hanging.
                out.append(await asyncio.wait_for(q.get(), 10))
            return out, q.statistics().bad_files

    assert asyncio.run(drain()) == (whole, 1)
    # The command the error names repairs the queue: then the default read succeeds.
    with pytest.raises(DataLoss, match=r"'(python -m aiodiskqueue repair [^']+)'") as info:
        read_all(options(tmp_path / "q", "q"))
    found = re.search(r"'python -m aiodiskqueue (repair [^']+)'", str(info.value))
    assert found is not None
    done = subprocess.run([sys.executable, "-m", "aiodiskqueue", *shlex.split(found.group(1))],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert read_all(options(tmp_path / "q", "q")) == whole


def test_torn_tail_of_the_last_segment_is_no_data_loss(tmp_path: Path) -> None:
    items = [b"t%05d" % i for i in range(2500)]
    asyncio.run(fill(tmp_path, "q", items, max_bytes_per_file=10_000))
    lay = Layout(str(tmp_path), "q")
    with open(lay.segment_path(max(lay.segments())), "ab") as f:
        f.write(b"\x00\x00\x00\x06t0")  # what a crash in the middle of a write leaves
    assert read_all(options(tmp_path, "q")) == items
    assert read_all(options(tmp_path, "q", arrow="false")) == items


def test_torn_record_in_a_completed_segment_fails_a_stream(tmp_path: Path) -> None:
    whole = torn_queue(tmp_path)
    reader = DiskQueueStreamReader(options(tmp_path, "q"))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    with pytest.raises(DataLoss, match=r"is a completed segment \(a later one follows\)"):
        rows_of(reader.options, list(parts))  # type: ignore[arg-type]
    lenient = DiskQueueStreamReader(options(tmp_path, "q", failOnDataLoss="false"))
    got = []
    start = lenient.initialOffset()
    while (end := lenient.latestOffset(start, ReadMaxRows(700))) != start:
        got += [r[3] for r in rows_of(lenient.options,
                                      list(lenient.partitions(start, end)))]  # type: ignore[arg-type]
        start = end
    assert got == whole


def test_trigger_limit_goes_round_the_queues(tmp_path: Path) -> None:
    for name in ("ev-a", "ev-b", "ev-c"):
        asyncio.run(fill(tmp_path, name, [b"%s%03d" % (name.encode(), i) for i in range(100)]))
    reader = DiskQueueStreamReader(options(tmp_path, "ev-*"))
    start = reader.initialOffset()
    # 11-byte records: a queue's 100 records end at byte 1100.
    first = reader.latestOffset(start, ReadMaxRows(150))
    assert first == {"ev-a": [0, 1100], "ev-b": [0, 550], "ev-c": [0, 0]}
    second = reader.latestOffset(first, ReadMaxRows(150))
    assert second == {"ev-a": [0, 1100], "ev-b": [0, 1100], "ev-c": [0, 1100]}


def test_releasing_a_removed_queue_does_not_create_it_again(tmp_path: Path) -> None:
    drained_queues(tmp_path, 1)
    lay = Layout(str(tmp_path), "ev-0000")
    for p in tmp_path.iterdir():
        os.utime(p, (time.time() - 3600,) * 2)
    reader = DiskQueueStreamReader(options(tmp_path, "ev-*", consume="true",
                                           removeDrainedAfter="1"))
    start = {"ev-0000": [0, 5]}  # the end of the batch before, as Spark passes it
    reader.latestOffset(start, ReadAllAvailable())
    assert not list(tmp_path.glob("ev-0000.*"))
    reader.commit(start)  # Spark commits the batch before after planning the next one
    assert not list(tmp_path.glob("ev-0000.*"))
    assert not os.path.exists(lay.meta_path)


def test_partition_size_follows_spark_file_sources(tmp_path: Path) -> None:
    cpus = os.cpu_count() or 1
    default = options(tmp_path, "q")
    # A small micro-batch stays one partition; a large read is spread over the CPUs.
    assert default.partition_bytes(300_000) == 4 << 20
    assert default.partition_bytes(cpus * (64 << 20)) == 64 << 20
    assert default.partition_bytes(10 << 30) == 128 << 20
    # An explicit minPartitions is honoured however small the read.
    assert options(tmp_path, "q", minPartitions="8").partition_bytes(21_000_000) == 2_625_000
    assert options(tmp_path, "q", maxBytesPerPartition="1000").partition_bytes(300_000) == 1000


@pytest.mark.parametrize(("extra", "message"), [
    ({"minMsgSize": "10", "maxMsgSize": "5"},
     "diskqueue: option 'minMsgSize' must be <= maxMsgSize, got 10 > 5"),
    ({"maxMsgSize": str(2**31)},
     "diskqueue: option 'maxMsgSize' must be in [0, 2147483647], got 2147483648"),
    ({"maxBytesPerFile": "0"}, "diskqueue: option 'maxBytesPerFile' must be >= 1, got 0"),
], ids=["min-above-max", "max-too-large", "no-file-size"])
def test_queue_options_are_checked_by_the_queues_own_definition(
        extra: dict[str, str], message: str) -> None:
    """The source's queue options are the queues' own: the same bounds, under its names."""
    from aiodiskqueue.spark._options import OptionError, parse_options

    with pytest.raises(OptionError) as info:
        parse_options({"path": "/tmp", "name": "q", **extra})
    assert str(info.value) == message

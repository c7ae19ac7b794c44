"""Every reader of a queue's files applies the zero-filled tail rule of recovery
(``zero_filled_tail`` in ``_format/scan.py``): ``verify``/``inspect`` and ``repair``,
``dump``, ``ls`` and the Spark source. Without the empty-message marker, zero-length
records that end the last segment past the meta's write position are no messages;
with it, they are acknowledged empty messages and no problem."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.meta import Meta
from aiodiskqueue.spark._files import iter_records, view_queue
from aiodiskqueue.tools.follow import iter_messages
from aiodiskqueue.tools.inspect import Problem, analyze, unindexed_tail
from aiodiskqueue.tools.repair import plan_repair, repair


def rec(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


SYNCED = rec(b"alpha") + rec(b"beta")  # 17 bytes, covered by the meta
TAIL = rec(b"gamma")  # 9 bytes past the meta's write position


def make(directory: Path, tail: bytes, marked: bool, meta: bool = True) -> Layout:
    lay = Layout(str(directory), "q")
    Path(lay.segment_path(0)).write_bytes(SYNCED + TAIL + tail)
    if meta:
        Path(lay.meta_path).write_bytes(Meta(2, 0, 0, 0, len(SYNCED)).encode())
    if marked:
        Path(lay.empty_marker_path).touch()
    return lay


def kinds(problems: tuple[Problem, ...] | list[Problem]) -> list[str]:
    return [p.kind for p in problems]


@pytest.mark.parametrize("meta", [True, False], ids=["meta", "no-meta"])
def test_verify_reports_a_zero_filled_tail_and_repair_cuts_it(tmp_path: Path,
                                                              meta: bool) -> None:
    lay = make(tmp_path, bytes(4 * 100 + 2), marked=False, meta=meta)
    rep = analyze(lay)
    assert "zero-filled tail" in kinds(rep.problems)
    assert not rep.sound
    assert rep.depth == 3  # alpha, beta, gamma: no phantom empty messages
    assert rep.write == (0, len(SYNCED + TAIL))
    plan = plan_repair(rep)
    assert ("truncate", len(SYNCED + TAIL)) in [(a.kind, a.offset) for a in plan.actions]
    repair(lay)
    assert Path(lay.segment_path(0)).stat().st_size == len(SYNCED + TAIL)
    assert analyze(lay).sound


def test_verify_with_the_marker_calls_trailing_empty_messages_data(tmp_path: Path) -> None:
    lay = make(tmp_path, rec(b"") + rec(b""), marked=True)
    rep = analyze(lay)
    assert kinds(rep.problems) == ["stale meta"]  # records past the meta: normal after a kill
    assert rep.depth == 5
    assert lay.empty_marker_path.endswith("q.diskqueue.empty")


def test_verify_min_msg_size_zeros_are_a_zero_filled_tail_not_a_bad_length(
        tmp_path: Path) -> None:
    lay = make(tmp_path, bytes(4096), marked=False)
    rep = analyze(lay, min_size=1)
    assert "zero-filled tail" in kinds(rep.problems)
    assert "bad length" not in kinds(rep.problems)
    assert rep.depth == 3


def test_verify_zeros_then_garbage_are_a_bad_length_where_the_zeros_start(
        tmp_path: Path) -> None:
    lay = make(tmp_path, bytes(4096) + b"\xff" * 8, marked=False)
    rep = analyze(lay)
    bad = [p for p in rep.problems if p.kind == "bad length"]
    assert [p.offset for p in bad] == [len(SYNCED + TAIL)]
    assert rep.depth == 3


@pytest.mark.parametrize("marked", [False, True], ids=["no-marker", "marker"])
def test_dump_and_ls_follow_the_rule(tmp_path: Path, marked: bool) -> None:
    lay = make(tmp_path, rec(b"") * 3, marked=marked)
    problems: list[Problem] = []
    got = [m.payload for m in iter_messages(lay, on_problem=problems.append)]
    meta = Meta(2, 0, 0, 0, len(SYNCED))
    count, end = unindexed_tail(lay, meta)
    if marked:
        assert got == [b"alpha", b"beta", b"gamma", b"", b"", b""]
        assert problems == []
        assert (count, end) == (4, (0, len(SYNCED + TAIL) + 12))
    else:
        assert got == [b"alpha", b"beta", b"gamma"]
        assert kinds(problems) == ["zero-filled tail"]
        assert (count, end) == (1, (0, len(SYNCED + TAIL)))


@pytest.mark.parametrize("marked", [False, True], ids=["no-marker", "marker"])
def test_spark_view_follows_the_rule(tmp_path: Path, marked: bool) -> None:
    lay = make(tmp_path, rec(b"") * 3, marked=marked)
    view = view_queue(lay, 0, 1 << 20)
    got = [r[0] for chunk in iter_records(lay, view.spans, 0, 1 << 20) for r in chunk]
    if marked:
        assert got == [b"alpha", b"beta", b"gamma", b"", b"", b""]
        assert view.torn is None
    else:
        assert got == [b"alpha", b"beta", b"gamma"]
        assert view.tail_records == 1
        assert view.torn == (0, len(SYNCED + TAIL), len(SYNCED + TAIL) + 12)


async def test_what_the_queue_keeps_verify_calls_sound(tmp_path: Path) -> None:
    # Acknowledged empty messages past the meta (sync_every=1): after a clean close the
    # meta covers them; verify agrees with the queue either way.
    async with DiskQueue(tmp_path, "q", sync_every=1) as q:
        await q.put(b"a")
        await q.put(b"")
    assert analyze(Layout(str(tmp_path), "q")).sound


@pytest.mark.parametrize("marked", [False, True], ids=["no-marker", "marker"])
def test_ls_knows_the_marker_and_counts_by_the_rule(tmp_path: Path, marked: bool) -> None:
    from aiodiskqueue._format.layout import queue_files
    from aiodiskqueue.tools.cli.queues import ls_entry

    lay = make(tmp_path, rec(b"") * 3, marked=marked)
    entry = ls_entry(lay)
    assert entry["empty_messages"] is marked
    assert entry["depth"] == (6 if marked else 3)
    assert (lay.empty_marker_path in queue_files(lay)) is marked


@pytest.mark.parametrize("meta", [
    Meta(2, 0, 0, 0, len(SYNCED + TAIL) + 2),
    Meta(2, 0, 0, 0, 4 * 200),
    Meta(-1, 0, 0, 0, len(SYNCED + TAIL) + 4 * 100),
], ids=["inside-a-zero-record", "past-the-end", "negative-depth"])
async def test_repair_looks_for_the_tail_where_the_queue_does(tmp_path: Path,
                                                             meta: Meta) -> None:
    # A meta the queue rejects (its write position inside a record or past the file's
    # end, a negative depth): the queue recounts from the read position and cuts the
    # zero-filled tail found from there. repair must keep the same records, soundly.
    lays = []
    for sub in ("as_is", "repaired"):
        (tmp_path / sub).mkdir()
        lay = make(tmp_path / sub, bytes(4 * 100 + 1), marked=False)
        Path(lay.meta_path).write_bytes(meta.encode())
        lays.append(lay)
    as_is, repaired = lays
    rep = analyze(repaired)
    assert "zero-filled tail" in kinds(rep.problems)
    assert rep.depth == 3 and rep.write == (0, len(SYNCED + TAIL))
    repair(repaired)
    assert Path(repaired.segment_path(0)).read_bytes() == SYNCED + TAIL
    assert analyze(repaired).sound

    for lay in (as_is, repaired):
        async with DiskQueue(lay.directory, "q") as q:
            got = [await q.get() for _ in range(q.qsize())]
            stats = q.statistics()
        assert got == [b"alpha", b"beta", b"gamma"]
    assert (stats.bad_files, stats.recovered) == (0, 0)

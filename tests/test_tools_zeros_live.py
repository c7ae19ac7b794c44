"""``dump --follow`` and the live ``stats`` sampler apply the zero-filled tail rule of
recovery (``zero_filled_tail`` in ``_format/scan.py``) like ``dump``: what they show of
a queue's files is what the queue delivers when it opens them."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tools_zeros import SYNCED, TAIL, make, rec

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.layout import Layout
from aiodiskqueue.tools.follow import Follower, Watcher, iter_messages

ZEROS = bytes(4 * 50 + 2)  # 50 "empty records" and 2 bytes of a torn one


async def drained(lay: Layout) -> list[bytes]:
    async with DiskQueue(lay.directory, lay.name) as q:
        return [await q.get() for _ in range(q.qsize())]


CASES = {
    "zeros-meta": (ZEROS, False, True),
    "zeros-no-meta": (ZEROS, False, False),
    "empty-records-no-marker": (rec(b"") * 3, False, True),
    "empty-records-marker": (rec(b"") * 3, True, True),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
async def test_follow_and_stats_show_what_the_queue_delivers(tmp_path: Path,
                                                             case: str) -> None:
    tail, marked, meta = CASES[case]
    lay = make(tmp_path, tail, marked, meta)
    follower = Follower(lay)
    followed = [m.payload for m in follower.poll()]
    assert [m.payload for m in follower.poll()] == []  # a held-back tail is not repeated
    dumped = [m.payload for m in iter_messages(lay)]
    depth = Watcher(lay).sample(1.0).depth
    got = await drained(lay)  # recovery: the rule's owner
    assert followed == dumped == got
    assert depth == len(got)
    if marked:
        assert follower.problems == []
    else:
        assert got == [b"alpha", b"beta", b"gamma"]
        assert [p.kind for p in follower.problems] == ["zero-filled tail"]


async def test_follow_reports_a_zero_filled_tail_once_and_reads_on(tmp_path: Path) -> None:
    # Held back, not skipped: if records follow the zero-length ones later (they were
    # real, written before the marker), the follower delivers them all in order.
    lay = make(tmp_path, rec(b"") * 2, marked=False)
    follower = Follower(lay)
    assert [m.payload for m in follower.poll()] == [b"alpha", b"beta", b"gamma"]
    follower.poll()
    assert len(follower.problems) == 1
    with open(lay.segment_path(0), "ab") as f:
        f.write(rec(b"delta"))
    assert [m.payload for m in follower.poll()] == [b"", b"", b"delta"]


def test_stats_write_position_and_rates_leave_the_tail_out(tmp_path: Path) -> None:
    lay = make(tmp_path, ZEROS, marked=False)
    w = Watcher(lay)
    first = w.sample(1.0)
    assert first.write == (0, len(SYNCED + TAIL))
    with open(lay.segment_path(0), "ab") as f:
        f.write(bytes(400))  # more zeros: no puts
    s = w.sample(2.0)
    assert (s.depth, s.put_rate, s.write) == (3, 0.0, (0, len(SYNCED + TAIL)))

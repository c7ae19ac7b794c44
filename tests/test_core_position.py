"""The consumer position worked out from the read-ahead's runs (``_core/position.py``)
is the end of the last message taken, as if every ready message carried its own."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

from helpers_format import read_meta
from helpers_props import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from aiodiskqueue import DiskQueue
from aiodiskqueue._core.position import Runs, Stretch

# One step: add a batch (as a Stretch or as records; after a gap or not; in the same
# file or the next), take some messages, or look at the position.
steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 40), max_size=6), st.booleans(),
              st.sampled_from(["same", "gap", "next_file"])),
    st.tuples(st.just("take"), st.integers(1, 8)),
    st.tuples(st.just("at")),
), max_size=40)


@settings(max_examples=examples(500), deadline=None)
@given(steps, st.tuples(st.integers(0, 3), st.integers(0, 10_000)))
def test_position_is_the_end_of_the_last_message_taken(plan: list[tuple[Any, ...]],
                                                       base: tuple[int, int]) -> None:
    runs = Runs()
    runs.reset(base)
    ready: deque[tuple[bytes, int, int]] = deque()  # the model: every message's own end
    ready_bytes = 0  # payload bytes of what is ready, as the buffers count them
    expected = base
    file_num, pos = base
    for step in plan:
        if step[0] == "add":
            _, lens, as_stretch, where = step
            if where == "gap":
                pos += 7
            elif where == "next_file":
                file_num, pos = file_num + 1, 0
            start = pos
            records = []
            for n in lens:
                pos += 4 + n
                records.append((bytes(n), file_num, pos))
            if as_stretch:
                runs.add(file_num, start, pos, len(lens), len(ready))
            else:
                assert runs.add_records(records, len(ready)) == [r[0] for r in records]
            ready.extend(records)
            ready_bytes += sum(lens)
        elif step[0] == "take":
            for _ in range(min(step[1], len(ready))):
                payload, f, end = ready.popleft()
                ready_bytes -= len(payload)
                expected = (f, end)
        else:
            assert runs.at(len(ready), ready_bytes + 4 * len(ready)) == expected
    assert runs.at(len(ready), ready_bytes + 4 * len(ready)) == expected


def test_touching_batches_share_one_run() -> None:
    # Handed-over batches that follow each other keep one run, however many there are.
    runs = Runs()
    for i in range(1000):
        runs.add(0, i * 10, i * 10 + 10, 1, i)
    assert len(runs.runs) == 1
    assert runs.at(1, 10) == (0, 9990)
    runs.add(1, 0, 10, 1, 1)  # the next file starts a run
    assert len(runs.runs) == 2
    assert runs.at(1, 10) == (0, 10_000)  # taken down to the first message of file 1


def test_runs_taken_whole_are_dropped_when_a_batch_joins() -> None:
    runs = Runs()
    runs.add(0, 0, 30, 3, 0)
    runs.add(0, 50, 60, 1, 3)  # after a gap: a second run
    assert runs.at(1, 10) == (0, 30)  # the first run taken whole: its end
    assert len(runs.runs) == 2  # at() changes nothing (statistics() may call it off the loop)
    runs.add(0, 60, 70, 1, 1)  # the first run is dropped, the batch joins the second
    assert list(runs.runs) == [(0, 50, 70, 2)] and runs.base == (0, 30)
    runs.add(2, 0, 10, 1, 0)  # nothing was ready: every run was taken
    assert list(runs.runs) == [(2, 0, 10, 1)] and runs.base == (0, 70)


def test_a_position_from_numbers_a_moment_apart_is_near_and_raises_nothing() -> None:
    # Another thread's statistics() can pass counts taken before or after the runs
    # changed: the answer stays inside the runs, and nothing is raised or changed.
    runs = Runs()
    runs.reset((0, 100))
    runs.add(0, 100, 140, 4, 0)
    before = (runs.base, list(runs.runs), runs.count)
    assert runs.at(9, 90) == (0, 100)  # more ready than the runs hold
    assert runs.at(2, 9999) == (0, 100)  # more bytes than the run holds: its start
    assert runs.at(2, -5) == (0, 140)  # fewer: its end
    assert runs.at(-3, 0) == (0, 140)
    assert (runs.base, list(runs.runs), runs.count) == before


def test_stretch_fields() -> None:
    s = Stretch([b"ab"], 3, 10, 16)
    assert (s.payloads, s.file_num, s.start, s.end) == ([b"ab"], 3, 10, 16)


def test_statistics_from_another_thread_while_the_loop_reads_and_takes(tmp_path: Path) -> None:
    # A metrics scrape (prometheus_client's HTTP thread) or a repr from another thread
    # reads the position while the loop adds read-ahead batches and takes messages.
    errors: list[BaseException] = []
    stop = threading.Event()

    def scrape(q: DiskQueue) -> None:
        while not stop.is_set():
            try:
                q.statistics()
                repr(q)
            except BaseException as exc:  # noqa: BLE001 - what the test looks for
                errors.append(exc)
                return

    async def main() -> tuple[int, int]:
        async with DiskQueue(tmp_path, "q", max_bytes_per_file=20_000, read_buffer_bytes=4096,
                             sync_every=200) as q:
            t = threading.Thread(target=scrape, args=(q,))
            switch = sys.getswitchinterval()
            sys.setswitchinterval(1e-6)  # let the scraper run between any two bytecodes
            t.start()
            n = 0
            try:
                for _ in range(100):
                    await q.put_many([b"%06d" % (n + i) + b"x" * 50 for i in range(40)])
                    for _ in range(40):
                        assert await asyncio.wait_for(q.get(), 10) == b"%06d" % n + b"x" * 50
                        n += 1
            finally:
                stop.set()
                t.join()
                sys.setswitchinterval(switch)
            await q.sync()
            st = q.statistics()
            assert (st.read_file_num, st.read_pos) == (st.write_file_num, st.write_pos)
            return st.write_file_num, st.write_pos

    write_at = asyncio.run(main())
    assert errors == []
    meta = read_meta(tmp_path, "q")
    assert (meta.depth, meta.read_file, meta.read_pos) == (0, *write_at)

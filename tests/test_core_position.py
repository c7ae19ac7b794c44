"""The consumer position worked out from the read-ahead's runs (``_core/position.py``)
is the end of the last message taken, as if every ready message carried its own."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from aiodiskqueue._core.position import Runs, Stretch

# One step: add a batch (as a Stretch or as records; after a gap or not; in the same
# file or the next), take some messages, or look at the position.
steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 40), max_size=6), st.booleans(),
              st.sampled_from(["same", "gap", "next_file"])),
    st.tuples(st.just("take"), st.integers(1, 8)),
    st.tuples(st.just("at")),
), max_size=40)


@settings(max_examples=500, deadline=None)
@given(steps, st.tuples(st.integers(0, 3), st.integers(0, 10_000)))
def test_position_is_the_end_of_the_last_message_taken(plan: list[tuple], base: tuple[int, int]
                                                       ) -> None:
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


def test_runs_taken_whole_are_dropped() -> None:
    runs = Runs()
    runs.add(0, 0, 30, 3, 0)
    runs.add(0, 50, 60, 1, 3)  # after a gap: a second run
    assert runs.at(1, 10) == (0, 30)  # the first run taken whole: its end
    assert len(runs.runs) == 1
    runs.add(2, 0, 10, 1, 0)  # nothing was ready: every run was taken
    assert len(runs.runs) == 1 and runs.base == (0, 60)


def test_stretch_fields() -> None:
    s = Stretch([b"ab"], 3, 10, 16)
    assert (s.payloads, s.file_num, s.start, s.end) == ([b"ab"], 3, 10, 16)

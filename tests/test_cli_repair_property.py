"""Property: whatever the damage, repair leaves a sound queue and loses no message
that the queue would have delivered from the damaged files.

Random damage (flipped bytes, overwritten length fields, truncations, deleted
files, perturbed meta numbers) is applied to a copy of a go-diskqueue fixture;
one copy is drained as it is, another is drained after ``repair``.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from conftest import require_fixtures
from helpers_props import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aiodiskqueue import DiskQueue, Statistics
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.meta import Meta
from aiodiskqueue.tools.inspect import analyze
from aiodiskqueue.tools.repair import repair


async def _take_all(d: Path, name: str) -> tuple[list[bytes], Statistics]:
    async with DiskQueue(d, name, max_bytes_per_file=1024) as q:
        stats = q.statistics()
        out: list[bytes] = []
        # qsize() of a damaged queue is an upper bound until reading meets the
        # damage; the queue then lowers it, but a get() already waiting keeps
        # waiting for a put (as asyncio.Queue.get does). So a get() that times
        # out is fine only if the queue has found there is nothing left.
        while q.qsize():
            try:
                out.append(await asyncio.wait_for(q.get(), 5))
            except TimeoutError:
                assert q.qsize() == 0
        return out, stats


Damage = tuple[str, int, int, int]  # kind, file choice, offset choice, value

damage_st = st.tuples(
    st.sampled_from(["flip", "length", "truncate", "delete", "meta"]),
    st.integers(0, 10**6), st.integers(0, 10**6), st.integers(-(2**31), 2**31 - 1),
)


def _apply(d: Path, name: str, damage: Damage) -> None:
    kind, fchoice, ochoice, value = damage
    files = sorted(p for p in d.iterdir() if p.name.startswith(f"{name}.diskqueue."))
    if not files:
        return
    meta = d / f"{name}.diskqueue.meta.dat"
    if kind == "meta":
        if meta.exists():
            nums = [int(x) for x in re.findall(rb"-?\d+", meta.read_bytes())]
            if len(nums) == 5:
                nums[fchoice % 5] = max(0, nums[fchoice % 5] + value % 81 - 40)
                meta.write_bytes(b"%d\n%d,%d\n%d,%d\n" % tuple(nums))
        return
    f = files[fchoice % len(files)]
    if kind == "delete":
        f.unlink()
        return
    data = bytearray(f.read_bytes())
    if not data:
        return
    off = ochoice % len(data)
    if kind == "truncate":
        os.truncate(f, off)
    elif kind == "flip":
        data[off] ^= 1 + value % 255
        f.write_bytes(bytes(data))
    else:
        data[off:off + 4] = value.to_bytes(4, "big", signed=True)
        f.write_bytes(bytes(data))


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Damage in the consumed part of the read segment (a length running past the file's
# end): the queue once quarantined that segment, intact unread records and all.
@example(name="partial", damages=[("flip", 0, 1, 0)])
# A consumed record of length 0 before the damage: verify and repair once subtracted it
# from the records counted from the read position (a depth one short).
@example(name="partial", damages=[("length", 0, 0, 0)])
# The meta's write position 40 bytes back, inside the last record: the queue recounts
# from the read position; repair once looked for a zero-filled tail from inside the
# record, cut the record in half and stored a depth 10 short.
@example(name="fixture", damages=[("meta", 4, 0, 0)])
@given(name=st.sampled_from(["fixture", "partial", "multi", "oversize"]),
       damages=st.lists(damage_st, min_size=1, max_size=3))
def test_repair_keeps_what_the_queue_would_deliver(name: str, damages: list[Damage]) -> None:
    src = require_fixtures()
    max_size = 1000 if name == "oversize" else 1 << 20
    with tempfile.TemporaryDirectory() as tmp:
        as_is, repaired = Path(tmp) / "as_is", Path(tmp) / "repaired"
        as_is.mkdir()
        for entry in src.iterdir():
            if entry.name.startswith(f"{name}.diskqueue."):
                shutil.copyfile(entry, as_is / entry.name)
        for dmg in damages:
            _apply(as_is, name, dmg)
        shutil.copytree(as_is, repaired)

        lay = Layout(str(repaired), name)
        repair(lay, 0, max_size)
        after = analyze(lay, 0, max_size)
        assert after.sound, [str(p) for p in after.problems]

        got_as_is, _ = asyncio.run(_take_all(as_is, name))
        got_repaired, stats = asyncio.run(_take_all(repaired, name))
        # The queue agrees the repaired files are consistent...
        assert (stats.bad_files, stats.recovered) == (0, 0)
        assert stats.depth == after.depth == len(got_repaired)
        # ...and repair lost nothing the queue would have delivered.
        assert not Counter(got_as_is) - Counter(got_repaired)


def _rec(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def test_repair_of_a_write_position_inside_a_record_keeps_the_record(tmp_path: Path) -> None:
    # The meta's write position lies inside the last record: the queue finds garbage
    # there, rejects it and recounts from the read position, delivering all three.
    # repair must do the same: cut nothing, index all three, store the real end.
    payloads = [b"alpha", b"beta", b"a record the meta's write position falls inside"]
    data = b"".join(_rec(p) for p in payloads)
    inside = len(_rec(payloads[0]) + _rec(payloads[1])) + 10
    copies = []
    for sub in ("as_is", "repaired"):
        d = tmp_path / sub
        d.mkdir()
        lay = Layout(str(d), "q")
        Path(lay.segment_path(0)).write_bytes(data)
        Path(lay.meta_path).write_bytes(Meta(3, 0, 0, 0, inside).encode())
        copies.append(lay)
    as_is, repaired = copies

    before = analyze(repaired)
    assert ("bad position", inside) in [(p.kind, p.offset) for p in before.problems]
    assert before.depth == 3 and before.write == (0, len(data))
    plan, _ = repair(repaired)
    assert [a.kind for a in plan.actions] == ["write meta"]
    assert plan.meta == Meta(3, 0, 0, 0, len(data))
    assert Path(repaired.segment_path(0)).read_bytes() == data
    assert not repaired.bad_files()
    after = analyze(repaired)
    assert after.sound, [str(p) for p in after.problems]

    got_as_is, _ = asyncio.run(_take_all(Path(as_is.directory), "q"))
    got, stats = asyncio.run(_take_all(Path(repaired.directory), "q"))
    assert got_as_is == got == payloads
    assert (stats.bad_files, stats.recovered, stats.depth) == (0, 0, 3)

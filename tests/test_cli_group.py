"""The command line on queue groups: ``ls`` shows a group as one entry with its shards, who
holds each role and the total depth; ``stats``, ``inspect`` and ``verify`` take a group's
name; a name that is both a plain queue and a group, and the commands that work on one
queue, give clear errors and change nothing."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from aiodiskqueue import DiskQueue, QueueGroup
from aiodiskqueue._format.group import GroupMeta, create_group_meta, group_layout
from aiodiskqueue.tools.cli import main

MAX = 1 << 20


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """``main(ARGS)`` in this process: exit code, stdout, stderr."""
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def run_json(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, Any]:
    code, out, err = run(capsys, *args, "--json")
    assert out, err
    return code, json.loads(out)


async def make_group(directory: Path, name: str, contents: list[list[bytes]]) -> None:
    """Group ``name`` with one shard per list in ``contents``, each holding those messages
    (closed: a plain queue per shard, written as a group's producer writes it)."""
    lay = group_layout(directory, name)
    create_group_meta(lay, GroupMeta(max_bytes_per_file=MAX * 100, min_msg_size=0,
                                     max_msg_size=MAX))
    for num, items in enumerate(contents):
        os.makedirs(lay.shard_path(num))
        async with DiskQueue(lay.shard_path(num), name, role="producer") as q:
            await q.put_many(items)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


async def test_ls_shows_a_group_as_one_entry_with_shards_roles_and_total_depth(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await make_group(tmp_path, "ingest", [[b"a%d" % i for i in range(5)],
                                          [b"b%d" % i for i in range(7)]])
    async with DiskQueue(tmp_path, "plain") as q:
        await q.put(b"x")
    # A live producer in shard 1 and a live consumer in shard 0, in this process.
    lay = group_layout(tmp_path, "ingest")
    prod = await DiskQueue.open(lay.shard_path(1), "ingest", role="producer")
    cons = await DiskQueue.open(lay.shard_path(0), "ingest", role="consumer", sync_every=1)
    try:
        await prod.put(b"b7")
        assert await cons.get() == b"a0"
        await cons.sync()
        code, entries = run_json(capsys, "ls", tmp_path)
        assert code == 0
        assert [(e["name"], e["kind"]) for e in entries] == [("ingest", "group"),
                                                            ("plain", "queue")]
        group = entries[0]
        assert group["depth"] == 4 + 8
        assert [(s["shard"], s["depth"]) for s in group["shards"]] == [(0, 4), (1, 8)]
        assert group["producers"] == [os.getpid()] and group["consumers"] == [os.getpid()]
        assert group["shards"][1]["roles"]["producer"]["pid"] == os.getpid()
        assert group["shards"][0]["roles"]["consumer"]["pid"] == os.getpid()
        assert group["shards"][0]["roles"]["producer"] is None
        assert group["meta"] == "ok" and group["segments"] == 2

        code, out, _ = run(capsys, "ls", tmp_path)
        assert code == 0
        lines = out.splitlines()
        head = next(ln for ln in lines if ln.startswith("ingest (group, 2 shard(s))"))
        pid = str(os.getpid())
        assert head.split()[4] == "12" and head.split()[-1] == f"{pid}/{pid}"
        s0 = next(ln for ln in lines if ln.startswith("  ingest/000000"))
        s1 = next(ln for ln in lines if ln.startswith("  ingest/000001"))
        assert s0.split()[1] == "4" and s0.split()[-1] == f"-/{pid}"
        assert s1.split()[1] == "8" and s1.split()[-1] == f"{pid}/-"
        assert any(ln.startswith("plain ") for ln in lines)
    finally:
        await prod.aclose()
        await cons.aclose()


async def test_stats_on_a_group_shows_each_shard_and_the_total(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await make_group(tmp_path, "g", [[b"x"] * 3, [], [b"y"] * 10])
    code, out, _ = run(capsys, "stats", tmp_path, "g", "--json")
    assert code == 0
    (sample,) = [json.loads(ln) for ln in out.splitlines()]
    assert (sample["name"], sample["kind"], sample["depth"]) == ("g", "group", 13)
    assert [(s["shard"], s["depth"]) for s in sample["shards"]] == [
        ("g/000000", 3), ("g/000001", 0), ("g/000002", 10)]
    code, out, _ = run(capsys, "stats", tmp_path, "g")
    assert code == 0
    rows = [ln.split() for ln in out.splitlines()[1:]]
    assert [(r[1], r[2]) for r in rows] == [("g/000000", "3"), ("g/000001", "0"),
                                            ("g/000002", "10"), ("TOTAL", "13")]


async def test_inspect_and_verify_a_group(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    await make_group(tmp_path, "g", [[b"m%d" % i for i in range(4)], [b"n"] * 2])
    code, rep = run_json(capsys, "inspect", tmp_path, "g")
    assert code == 0
    assert (rep["kind"], rep["depth"]) == ("group", 6)
    assert [(s["shard"], s["depth"], s["sound"]) for s in rep["shards"]] == [
        ("g/000000", 4, True), ("g/000001", 2, True)]
    code, out, _ = run(capsys, "inspect", tmp_path, "g")
    assert code == 0
    assert "unread    6 message(s) in the group" in out and "problems  none" in out
    code, out, _ = run(capsys, "verify", tmp_path, "g")
    assert code == 0 and out.splitlines()[-1] == "g: sound (2 shard(s))"

    # A torn record at the end of shard 1's segment: verify names the shard, exit 1.
    seg = Path(group_layout(tmp_path, "g").shard_layout(1).segment_path(0))
    with open(seg, "ab") as f:
        f.write(b"\0\0\0\x09ab")
    code, out, _ = run(capsys, "verify", tmp_path, "g")
    assert code == 1
    assert "g/000001: 1 problem(s)" in out and "torn tail" in out
    assert "g/000000: sound (4 unread message(s) in 1 segment(s))" in out
    code, rep = run_json(capsys, "verify", tmp_path, "g")
    assert code == 1 and rep["sound"] is False
    assert [s["sound"] for s in rep["shards"]] == [True, False]


async def test_a_name_both_queue_and_group_is_an_error_and_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Made by hand: the queue first, then the group's files (each refuses the other).
    async with DiskQueue(tmp_path, "both") as q:
        await q.put(b"q")
    await make_group(tmp_path, "both", [[b"g"]])
    before = snapshot(tmp_path)
    for cmd in ("stats", "inspect", "verify", "dump", "repair"):
        code, _, err = run(capsys, cmd, tmp_path, "both")
        assert code == 2, cmd
        assert err == (f"aiodiskqueue: 'both' in {tmp_path} is both a plain queue "
                       f"(both.diskqueue.* files) and a queue group ({tmp_path}/both.group/); "
                       "move one of them away\n"), cmd
    assert snapshot(tmp_path) == before


async def test_one_queue_commands_on_a_group_name_the_shard_to_use(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await make_group(tmp_path, "g", [[b"x"]])
    before = snapshot(tmp_path)
    for cmd in ("dump", "repair"):
        code, _, err = run(capsys, cmd, tmp_path, "g")
        assert code == 2
        assert f"'g' is a queue group of 1 shard(s); '{cmd}' works on one queue" in err
        assert f"'{cmd} {tmp_path}/g.group/000000 g'" in err
    # ... and that command does work on the shard.
    code, out, _ = run(capsys, "dump", tmp_path / "g.group" / "000000", "g")
    assert (code, out) == (0, "x\n")
    assert snapshot(tmp_path) == before


async def test_a_damaged_shard_and_group_meta_are_reported_not_fatal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await make_group(tmp_path, "g", [[b"x"] * 2])
    lay = group_layout(tmp_path, "g")
    Path(lay.shard_path(1)).write_bytes(b"a file where a shard directory belongs")
    Path(lay.meta_path).write_bytes(b"{not json")
    before = snapshot(tmp_path)
    code, (entry,) = run_json(capsys, "ls", tmp_path)
    assert code == 0
    assert (entry["depth"], entry["meta"], entry["damaged_shards"]) == (2, "unreadable",
                                                                         ["000001"])
    code, out, _ = run(capsys, "ls", tmp_path)
    assert "g (group, 1 shard(s)) (group meta unreadable) (not a directory: 000001)" in out
    code, out, _ = run(capsys, "verify", tmp_path, "g")
    assert code == 1
    assert "g: group meta unreadable" in out
    assert "damaged shard" in out and "000001 is not a directory" in out
    code, out, _ = run(capsys, "inspect", tmp_path, "g")
    assert code == 0 and "meta      unreadable (not a group meta file" in out
    assert snapshot(tmp_path) == before


async def test_ls_and_inspect_name_a_live_group_consumer_and_producers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p1 = await QueueGroup.open(tmp_path, "jobs", "producer")
    p2 = await QueueGroup.open(tmp_path, "jobs", "producer")
    c = await QueueGroup.open(tmp_path, "jobs", "consumer", sync_every=1)
    try:
        await p1.put_many([b"a", b"b"])
        await p2.put_many([b"c"])
        assert await asyncio.wait_for(c.get(), 10) in (b"a", b"c")
        code, (entry,) = run_json(capsys, "ls", tmp_path)
        assert code == 0
        assert entry["members"] == [os.getpid()] and entry["producers"] == [os.getpid()]
        assert [s["shard"] for s in entry["shards"]] == [0, 1]
        assert entry["depth"] >= 2  # the consumer's taking is counted once it is stored
        code, out, _ = run(capsys, "ls", tmp_path)
        assert f"(group consumers: pids {os.getpid()})" in out
        code, out, _ = run(capsys, "inspect", tmp_path, "jobs")
        assert f"consumers 1 live: pids {os.getpid()}" in out
    finally:
        await c.aclose()
        await p1.aclose()
        await p2.aclose()
    code, (entry,) = run_json(capsys, "ls", tmp_path)
    assert (entry["members"], entry["producers"], entry["consumers"]) == ([], [], [])


def test_stats_watch_adds_a_shard_that_appears_between_samples(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(make_group(tmp_path, "g", [[b"x"] * 2]))
    slept: list[float] = []

    def new_shard_instead_of_sleeping(seconds: float) -> None:
        # Between the first and the second sample, a producer makes shard 1.
        slept.append(seconds)
        lay = group_layout(tmp_path, "g")
        os.makedirs(lay.shard_path(1))

        async def put() -> None:
            async with DiskQueue(lay.shard_path(1), "g", role="producer") as q:
                await q.put_many([b"y"] * 5)

        asyncio.run(put())

    monkeypatch.setattr(time, "sleep", new_shard_instead_of_sleeping)  # the CLI's interval
    code, out, _ = run(capsys, "stats", tmp_path, "g", "--watch", "--count", "2", "--json")
    assert code == 0 and slept == [1.0]
    first, second = (json.loads(ln) for ln in out.splitlines())
    assert [(s["shard"], s["depth"]) for s in first["shards"]] == [("g/000000", 2)]
    assert [(s["shard"], s["depth"]) for s in second["shards"]] == [("g/000000", 2),
                                                                    ("g/000001", 5)]
    assert (first["depth"], second["depth"]) == (2, 7)
    # A new shard's first sample has no rate; the group's put rate is the old shards'.
    assert second["shards"][1]["put_rate"] is None and second["put_rate"] == 0

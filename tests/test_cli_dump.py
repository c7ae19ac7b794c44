"""``aiodiskqueue dump``: formats, ranges, follow mode; never consumes anything."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO_ROOT as REPO
from conftest import copy_queue

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.scan import iter_spans
from aiodiskqueue.tools import follow


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


def cli(*args: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "aiodiskqueue", *map(str, args)],
                          capture_output=True, timeout=60, cwd=REPO, env=_env(), check=False)


def fixture_msg(i: int) -> bytes:
    return b"msg-%05d-" % i + b"x" * (i % 50)


def multi_msg(i: int) -> bytes:
    return bytes((i + j) & 0xFF for j in range(5 * (i % 1001)))


def oversize_msg(i: int) -> bytes:
    return bytes((i * 31 + j) & 0xFF for j in range([10, 200, 10, 82, 96, 0, 0, 300, 1][i]))


def tree(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_raw_prints_unread_messages_oldest_first(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "partial", tmp_path)
    before = tree(d)
    res = cli("dump", d, "partial")
    assert res.returncode == 0 and res.stderr == b""
    assert res.stdout.split(b"\n")[:-1] == [fixture_msg(i) for i in range(150, 1000)]
    assert tree(d) == before  # nothing consumed, nothing created


def test_from_and_limit_with_json(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "fixture", tmp_path)
    res = cli("dump", d, "fixture", "--from", "25", "--limit", "3", "--format", "json")
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [x["index"] for x in lines] == [25, 26, 27]
    assert [x["payload"].encode() for x in lines] == [fixture_msg(i) for i in (162, 163, 164)]
    assert lines[0]["encoding"] == "utf-8"
    # msg 162 is the last record of file 5 (1001 bytes), 163 opens file 6
    assert (lines[0]["file"], lines[0]["offset"]) == ("fixture.diskqueue.000005.dat",
                                                      1001 - 4 - len(fixture_msg(162)))
    assert (lines[1]["file"], lines[1]["offset"]) == ("fixture.diskqueue.000006.dat", 0)
    assert lines[0]["length"] == len(fixture_msg(162))
    # --json is the same as --format json
    same = cli("dump", d, "fixture", "--from", "25", "--limit", "3", "--json")
    assert same.stdout == res.stdout


def test_json_uses_base64_for_binary_payloads(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "multi", tmp_path)
    res = cli("dump", d, "multi", "--limit", "60", "--json")
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(rows) == 60
    encodings = set()
    for i, row in enumerate(rows):
        data = (base64.b64decode(row["payload"]) if row["encoding"] == "base64"
                else row["payload"].encode())
        assert data == multi_msg(i)
        encodings.add(row["encoding"])
    assert encodings == {"utf-8", "base64"}


def test_hex(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "oversize", tmp_path)
    res = cli("dump", d, "oversize", "--format", "hex", "--max-msg-size", "1000")
    lines = res.stdout.decode().splitlines()
    assert len(lines) == 9
    for i, line in enumerate(lines):
        index, _, _, length, hexdata = line.split("\t")
        assert (int(index), int(length)) == (i, len(oversize_msg(i)))
        assert bytes.fromhex(hexdata) == oversize_msg(i)
    assert lines[3].split("\t")[1:3] == ["oversize.diskqueue.000002.dat", "14"]


def _nsq(ts: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    return struct.pack(">qH", ts, attempts) + msg_id + body


async def test_nsq_decodes_id_timestamp_attempts(tmp_path: Path) -> None:
    ts = 1_700_000_000_123_456_789
    async with DiskQueue(tmp_path, "topic") as q:
        await q.put(_nsq(ts, 3, b"0a1b2c3d4e5f6789", b"hello nsq"))
        await q.put(_nsq(ts + 10**9, 1, b"0a1b2c3d4e5f678a", b"\xff\xfe"))
        await q.put(b"short")
    res = await asyncio.to_thread(cli, "dump", tmp_path, "topic", "--format", "nsq")
    lines = res.stdout.decode().splitlines()
    assert lines[0] == "0a1b2c3d4e5f6789 2023-11-14T22:13:20.123456Z attempts=3 hello nsq"
    assert lines[1].startswith("0a1b2c3d4e5f678a 2023-11-14T22:13:21.123456Z attempts=1 base64:")
    assert "too short for an nsq message" in lines[2]
    res = await asyncio.to_thread(cli, "dump", tmp_path, "topic", "--format", "nsq", "--json")
    first = json.loads(res.stdout.splitlines()[0])
    assert first["id"] == "0a1b2c3d4e5f6789"
    assert first["timestamp_ns"] == ts and first["attempts"] == 3
    assert (first["body"], first["encoding"]) == ("hello nsq", "utf-8")


def test_damaged_segment_is_reported_and_skipped(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "fixture", tmp_path)
    with open(d / "fixture.diskqueue.000006.dat", "r+b") as f:
        f.write(struct.pack(">i", -7))  # file 6 holds msgs 163..187
    res = cli("dump", d, "fixture")
    assert res.returncode == 0
    got = res.stdout.split(b"\n")[:-1]
    assert got == [fixture_msg(i) for i in range(137, 1000) if not 163 <= i <= 187]
    assert b"bad length" in res.stderr and b"fixture.diskqueue.000006.dat @ 0" in res.stderr


def test_unknown_queue(tmp_path: Path) -> None:
    res = cli("dump", tmp_path, "ghost")
    assert res.returncode == 2 and b"'ghost'" in res.stderr


async def test_follow_prints_new_messages_across_rolls(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "feed", max_bytes_per_file=64) as q:
        await q.put_many([b"early-%d" % i for i in range(5)])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aiodiskqueue", "dump", str(tmp_path), "feed", "--follow",
            "--limit", "25", "--json", "--interval", "0.02",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO,
            env=_env())
        assert proc.stdout is not None
        try:
            first = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
                     for _ in range(5)]
            assert [x["payload"] for x in first] == [f"early-{i}" for i in range(5)]
            for i in range(20):  # ~12 bytes a record, 64-byte files: several rolls
                await q.put(b"late-%02d" % i)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, err
        rest = [json.loads(x) for x in out.splitlines()]
        assert [x["payload"] for x in rest] == [f"late-{i:02d}" for i in range(20)]
        assert [x["index"] for x in first + rest] == list(range(25))
        assert len({x["file"] for x in rest}) > 2
        assert q.qsize() == 25  # nothing was consumed


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


async def test_quarantined_records_can_be_salvaged(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "fixture", tmp_path)
    # Damage the 4th record of file 7 (msgs 188..214): the queue quarantines the
    # file when it reads it; the first three records are still readable there.
    offset = sum(4 + len(fixture_msg(i)) for i in range(188, 191))
    _overwrite(d / "fixture.diskqueue.000007.dat", offset, struct.pack(">i", 1 << 30))
    async with DiskQueue(d, "fixture", max_bytes_per_file=1024) as q:
        while q.qsize():
            try:
                await asyncio.wait_for(q.get(), 5)
            except TimeoutError:
                assert q.qsize() == 0
    assert (d / "fixture.diskqueue.000007.dat.bad").exists()

    res = await asyncio.to_thread(cli, "dump", d, "fixture", "--quarantined", "--json")
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    assert [r["payload"].encode() for r in rows] == [fixture_msg(i) for i in (188, 189, 190)]
    assert {r["file"] for r in rows} == {"fixture.diskqueue.000007.dat.bad"}
    res = await asyncio.to_thread(cli, "inspect", d, "fixture", "--json")
    (bad,) = json.loads(res.stdout)["quarantined"]
    assert (bad["file"], bad["records"], bad["readable_bytes"], bad["problem"]) == \
        ("fixture.diskqueue.000007.dat.bad", 3, offset, "bad_length")
    res = await asyncio.to_thread(cli, "dump", d, "fixture", "--quarantined", "--follow")
    assert res.returncode == 2


def _follow_a_cut_segment(tmp_path: Path, removed: bool) -> list[str]:
    """A follower reads segment 0, cut in the middle of a record, with segment 1 beside it;
    with ``removed``, the segment's name goes away while it reads (the queue consumed it
    and frees it in steps). The kinds of problem it reports."""
    lay = Layout(str(tmp_path), "q")
    rec = struct.pack(">I", 5) + b"hello"
    Path(lay.segment_path(0)).write_bytes(rec * 3 + rec[:6])
    Path(lay.segment_path(1)).write_bytes(rec)
    def spans(path: str, *args: object) -> Iterator[object]:
        for span in iter_spans(path, *args):  # type: ignore[arg-type]
            if removed and os.path.exists(path):
                os.remove(path)
            yield span

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(follow, "iter_spans", spans)
        f = follow.Follower(lay, 1, 100, start=(0, 0))
        got = f.poll()
    assert [m.payload for m in got] == [b"hello"] * 4  # 3 in segment 0, 1 in segment 1
    return [p.kind for p in f.problems]


def test_follow_reports_a_cut_segment_that_is_still_there(tmp_path: Path) -> None:
    assert _follow_a_cut_segment(tmp_path, removed=False) == ["torn tail"]


def test_follow_does_not_report_a_segment_removed_while_it_read(tmp_path: Path) -> None:
    assert _follow_a_cut_segment(tmp_path, removed=True) == []

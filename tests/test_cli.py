"""The command line on real queues: ls, inspect, verify and repair.

Every command runs as a subprocess (``python -m aiodiskqueue``) on copies of
the go-diskqueue fixtures, on deliberately damaged copies, and on queues
written by a real (and a killed) DiskQueue process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT as REPO
from conftest import copy_queue

from aiodiskqueue import DiskQueue, Statistics

# ---------------------------------------------------------------------- helpers


def cli(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m aiodiskqueue ARGS`` with stdout and stderr captured."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "aiodiskqueue", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env,
                          check=False)


def cli_json(*args: object) -> tuple[int, Any]:
    res = cli(*args, "--json")
    assert res.stdout, res.stderr
    return res.returncode, json.loads(res.stdout)


def fixture_msg(i: int) -> bytes:
    return b"msg-%05d-" % i + b"x" * (i % 50)


def placement(msgs: list[bytes], max_bytes: int) -> list[tuple[int, int]]:
    """(file, offset) of each record under go-diskqueue's roll rule (the writer's rule)."""
    f = pos = 0
    out = []
    for m in msgs:
        if pos > 0 and pos + 4 + len(m) > max_bytes:
            f, pos = f + 1, 0
        out.append((f, pos))
        pos += 4 + len(m)
    return out


ALL_FIXTURE = [fixture_msg(i) for i in range(1000)]
WHERE = placement(ALL_FIXTURE, 1024)


def seg(name: str, num: int) -> str:
    return f"{name}.diskqueue.{num:06d}.dat"


def msgs_in_file(num: int) -> list[int]:
    return [i for i, (f, _) in enumerate(WHERE) if f == num]


def snapshot(d: Path) -> dict[str, tuple[int, int, str]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns,
                     hashlib.sha256(p.read_bytes()).hexdigest()) for p in sorted(d.iterdir())}


async def drain(d: Path, name: str, **opts: Any) -> tuple[list[bytes], Statistics]:
    """Open the queue with DiskQueue and take every message."""
    async def run() -> tuple[list[bytes], Statistics]:
        async with DiskQueue(d, name, **opts) as q:
            stats = q.statistics()
            out = [await q.get() for _ in range(q.qsize())]
            assert q.qsize() == 0
            return out, stats
    return await asyncio.wait_for(run(), 60)


def test_placement_oracle_matches_readme() -> None:
    # README: file 5 starts with msg 137, file 38 is 531 bytes, 000023 is exactly 1024 B.
    assert WHERE[137] == (5, 0)
    assert WHERE[999][0] == 38
    assert WHERE[999][1] + 4 + len(ALL_FIXTURE[999]) == 531
    last23 = max(msgs_in_file(23))
    assert WHERE[last23][1] + 4 + len(ALL_FIXTURE[last23]) == 1024


# ---------------------------------------------------------------------- ls


LS_FIELDS = {"name", "depth", "segments", "bytes", "read_file_num", "read_pos",
             "write_file_num", "write_pos", "bad_files", "locked_by_pid"}

EXPECTED_LS = {  # from the fixtures README
    "emptied": (0, 0, (4, 0), (4, 0)),
    "empty": (0, 1, (3, 840), (3, 840)),
    "fixture": (863, 34, (5, 0), (38, 531)),
    "multi": (2002, 79, (0, 0), (78, 29949)),
    "oversize": (9, 7, (0, 0), (6, 5)),
    "partial": (850, 34, (5, 741), (38, 531)),
}


def test_ls_json_lists_every_fixture_queue(gofx: Path, tmp_path: Path) -> None:
    for name in EXPECTED_LS:
        copy_queue(gofx, name, tmp_path)
    code, rows = cli_json("ls", tmp_path)
    assert code == 0
    assert [r["name"] for r in rows] == sorted(EXPECTED_LS)
    for r in rows:
        assert set(r) >= LS_FIELDS
        depth, segments, read, write = EXPECTED_LS[r["name"]]
        assert r["depth"] == depth
        assert r["segments"] == segments
        assert (r["read_file_num"], r["read_pos"]) == read
        assert (r["write_file_num"], r["write_pos"]) == write
        assert r["bad_files"] == 0
        assert r["locked_by_pid"] is None
        files = [p for p in tmp_path.iterdir()
                 if p.name.startswith(r["name"] + ".diskqueue.0")]
        assert r["bytes"] == sum(p.stat().st_size for p in files)


def test_ls_text_table(gofx: Path, tmp_path: Path) -> None:
    copy_queue(gofx, "partial", tmp_path)
    res = cli("ls", tmp_path)
    assert res.returncode == 0
    header, row = res.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "DEPTH", "SEGMENTS", "BYTES"]
    assert row.split() == ["partial", "850", "34", "33466", "5,741", "38,531", "0", "-", "-"]


async def test_ls_live_queue_shows_holder_and_real_depth(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "live", max_bytes_per_file=256) as q:
        await q.put_many([b"event-%d" % i for i in range(40)])
        await q.get()
        code, rows = await asyncio.to_thread(cli_json, "ls", tmp_path)
        assert code == 0
        (row,) = rows
        assert row["locked_by_pid"] == os.getpid()
        # Records past the meta's last sync are counted too, as the queue counts them
        # on open; the one taken may not be in the meta yet.
        assert row["depth"] in (39, 40)
        assert row["segments"] == len(list(tmp_path.glob("live.diskqueue.0*.dat")))
    code, rows = cli_json("ls", tmp_path)
    assert code == 0
    assert rows[0]["locked_by_pid"] is None
    assert rows[0]["depth"] == 39


def test_ls_missing_directory(tmp_path: Path) -> None:
    res = cli("ls", tmp_path / "nope")
    assert res.returncode == 2
    assert "nope" in res.stderr


# ---------------------------------------------------------------------- inspect


def test_inspect_partial(gofx: Path, tmp_path: Path) -> None:
    copy_queue(gofx, "partial", tmp_path)
    code, rep = cli_json("inspect", tmp_path, "partial")
    assert code == 0
    assert rep["meta"] == {"depth": 850, "read_file_num": 5, "read_pos": 741,
                           "write_file_num": 38, "write_pos": 531}
    assert rep["depth"] == rep["indexed_depth"] == 850
    segs = rep["segments"]
    assert [s["num"] for s in segs] == list(range(5, 39))
    first, last = segs[0], segs[-1]
    assert (first["role"], first["consumed"], first["unread"]) == ("read", 13, 13)
    assert first["start"] == 741 and first["end"] == first["size"] == 1001
    assert (last["role"], last["end"], last["unread"]) == ("write", 531, len(msgs_in_file(38)))
    for s in segs[1:]:
        assert s["unread"] == len(msgs_in_file(s["num"]))
    assert sum(s["unread"] for s in segs) == 850
    assert rep["problems"] == [] and rep["sound"] is True

    text = cli("inspect", tmp_path, "partial").stdout
    assert "depth 850, read 5,741, write 38,531" in text
    assert "meta 850, scan 850 (consistent)" in text
    assert "partial.diskqueue.000005.dat  1001       26  0..1001        13      13  read" in text


# ---------------------------------------------------------------------- verify


FIXTURE_OPTS = {
    "fixture": [], "partial": [], "empty": [], "emptied": [], "multi": [],
    "oversize": ["--max-msg-size", "1000"],
}


@pytest.mark.parametrize("name", sorted(FIXTURE_OPTS))
def test_verify_go_fixture_is_sound(gofx: Path, tmp_path: Path, name: str) -> None:
    copy_queue(gofx, name, tmp_path)
    before = snapshot(tmp_path)
    res = cli("verify", tmp_path, name, *FIXTURE_OPTS[name])
    assert res.returncode == 0, res.stdout
    assert res.stdout.startswith(f"{name}: sound (")
    assert res.stderr == ""  # no progress bar when stderr is not a terminal
    assert snapshot(tmp_path) == before


def test_verify_unknown_queue_is_an_error_naming_it(tmp_path: Path) -> None:
    res = cli("verify", tmp_path, "ghost")
    assert res.returncode == 2
    assert "'ghost'" in res.stderr and str(tmp_path) in res.stderr
    assert res.stdout == ""


def test_verify_reports_quarantined_files_but_stays_sound(gofx: Path, tmp_path: Path) -> None:
    copy_queue(gofx, "fixture", tmp_path)
    (tmp_path / (seg("fixture", 3) + ".bad")).write_bytes(b"\x00\x00\x00\x09junk")
    res = cli("verify", tmp_path, "fixture")
    assert res.returncode == 0
    assert "quarantined fixture.diskqueue.000003.dat.bad" in res.stdout
    code, rep = cli_json("verify", tmp_path, "fixture")
    assert code == 0 and rep["problems"] == []
    assert rep["quarantined"] == ["fixture.diskqueue.000003.dat.bad"]


# ---------------------------------------------------------------------- corruption, repair


Corrupt = Callable[[Path], None]


def _truncate_tail(d: Path) -> None:
    # Cut the last record of the write segment (msg 999, 59 B payload) after 10 bytes.
    os.truncate(d / seg("fixture", 38), WHERE[999][1] + 10)


def _truncate_middle(d: Path) -> None:
    last = max(msgs_in_file(12))
    os.truncate(d / seg("fixture", 12), WHERE[last][1] + 3)  # 3 bytes of a 4-byte length


def _garbage_length(value: int) -> Corrupt:
    def corrupt(d: Path) -> None:
        second = msgs_in_file(20)[1]
        with open(d / seg("fixture", 20), "r+b") as f:
            f.seek(WHERE[second][1])
            f.write(struct.pack(">i", value))
    return corrupt


def _delete_middle(d: Path) -> None:
    (d / seg("fixture", 20)).unlink()


def _meta_missing(d: Path) -> None:
    (d / "fixture.diskqueue.meta.dat").unlink()


def _meta_garbage(d: Path) -> None:
    (d / "fixture.diskqueue.meta.dat").write_bytes(b"not a meta file\n")


def _meta_stale(d: Path) -> None:
    # As a writer leaves it between syncs: the meta indexes messages 137..989 only.
    f, pos = WHERE[990]
    (d / "fixture.diskqueue.meta.dat").write_bytes(b"%d\n5,0\n%d,%d\n" % (990 - 137, f, pos))


def _depth_wrong(d: Path) -> None:
    (d / "fixture.diskqueue.meta.dat").write_bytes(b"800\n5,0\n38,531\n")


S20 = WHERE[msgs_in_file(20)[1]][1]
CASES: list[tuple[str, Corrupt, list[tuple[str, str, int]], set[int]]] = [
    ("truncated-record-tail", _truncate_tail,
     [("torn tail", seg("fixture", 38), WHERE[999][1]),
      ("meta ahead", seg("fixture", 38), 531)], {999}),
    ("truncated-record-middle", _truncate_middle,
     [("torn tail", seg("fixture", 12), WHERE[max(msgs_in_file(12))][1])],
     {max(msgs_in_file(12))}),
    ("garbage-length-huge", _garbage_length(0x7FFFFFFF),
     [("bad length", seg("fixture", 20), S20)], set(msgs_in_file(20)[1:])),
    ("garbage-length-negative", _garbage_length(-1),
     [("bad length", seg("fixture", 20), S20)], set(msgs_in_file(20)[1:])),
    ("deleted-middle-segment", _delete_middle,
     [("missing segment", seg("fixture", 20), 0)], set(msgs_in_file(20))),
    ("meta-missing", _meta_missing,
     [("meta missing", "fixture.diskqueue.meta.dat", 0)], set()),
    ("meta-unreadable", _meta_garbage,
     [("meta unreadable", "fixture.diskqueue.meta.dat", 0)], set()),
    ("meta-stale", _meta_stale,
     [("stale meta", seg("fixture", WHERE[990][0]), WHERE[990][1])], set()),
    ("depth-mismatch", _depth_wrong,
     [("depth mismatch", "fixture.diskqueue.meta.dat", 0)], set()),
]


@pytest.mark.parametrize(("corrupt", "expected", "lost"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_verify_repair_verify_keeps_every_readable_message(
    gofx: Path, tmp_path: Path, corrupt: Corrupt, expected: list[tuple[str, str, int]],
    lost: set[int],
) -> None:
    d = copy_queue(gofx, "fixture", tmp_path / "q")
    corrupt(d)

    # verify: non-zero, each problem with its file name and byte offset
    res = await asyncio.to_thread(cli, "verify", d, "fixture")
    assert res.returncode == 1, res.stdout
    for kind, file, offset in expected:
        assert any(kind in line and f"{file} @ {offset}:" in line
                   for line in res.stdout.splitlines()), (kind, file, offset, res.stdout)
    code, rep = await asyncio.to_thread(cli_json, "verify", d, "fixture")
    assert code == 1 and rep["sound"] is False
    found = {(p["kind"], p["file"], p["offset"]) for p in rep["problems"]}
    assert set(expected) <= found

    # repair --dry-run: exit 1, nothing on disk changes, not even a lock file
    before = snapshot(d)
    res = await asyncio.to_thread(cli, "repair", d, "fixture", "--dry-run")
    assert res.returncode == 1
    assert "would:" in res.stdout
    assert snapshot(d) == before
    assert not (d / "fixture.diskqueue.lock").exists()

    # repair, then verify is clean and a second repair has nothing to do
    res = await asyncio.to_thread(cli, "repair", d, "fixture")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "now sound" in res.stdout
    res = await asyncio.to_thread(cli, "verify", d, "fixture")
    assert res.returncode == 0, res.stdout
    res = await asyncio.to_thread(cli, "repair", d, "fixture", "--dry-run")
    assert (res.returncode, res.stdout.strip()) == (0, "fixture: nothing to repair")

    # every readable message survives, in order, and the queue finds nothing to fix
    got, stats = await drain(d, "fixture", max_bytes_per_file=1024)
    assert got == [ALL_FIXTURE[i] for i in range(137, 1000) if i not in lost]
    assert stats.bad_files == 0 and stats.recovered == 0


async def test_quarantine_keeps_the_whole_original(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "fixture", tmp_path)
    _garbage_length(-1)(d)
    original = (d / seg("fixture", 20)).read_bytes()
    res = cli("repair", d, "fixture")
    assert res.returncode == 0
    assert (d / (seg("fixture", 20) + ".bad")).read_bytes() == original
    assert (d / seg("fixture", 20)).read_bytes() == original[:S20]
    code, rows = cli_json("ls", d)
    assert code == 0
    assert rows[0]["bad_files"] == 1
    assert rows[0]["bad_file_names"] == [seg("fixture", 20) + ".bad"]


def test_stale_meta_and_torn_tail_are_told_apart(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "fixture", tmp_path)
    _meta_stale(d)
    with open(d / seg("fixture", 38), "ab") as f:
        f.write(b"\x00\x00\x00\x30partial")  # a record cut short by a crash
    code, rep = cli_json("verify", d, "fixture")
    assert code == 1
    kinds = {(p["kind"], p["severity"], p["offset"]) for p in rep["problems"]}
    assert kinds == {("stale meta", "warning", WHERE[990][1]), ("torn tail", "error", 531)}
    code, plan = cli_json("repair", d, "fixture", "--dry-run")
    assert code == 1
    assert [a["kind"] for a in plan["actions"]] == ["truncate", "write meta"]
    assert plan["actions"][0]["offset"] == 531


async def test_repair_refuses_while_open(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "busy") as q:
        await q.put_many([b"a", b"b", b"c"])
        before = snapshot(tmp_path)
        for extra in ([], ["--dry-run"]):
            res = await asyncio.to_thread(cli, "repair", tmp_path, "busy", *extra)
            assert res.returncode == 2
            assert f"open in process {os.getpid()}" in res.stderr
        assert snapshot(tmp_path) == before
        assert await q.get() == b"a"


def test_repair_of_a_sound_queue_changes_nothing(gofx: Path, tmp_path: Path) -> None:
    d = copy_queue(gofx, "partial", tmp_path)
    before = snapshot(d)
    res = cli("repair", d, "partial")
    assert (res.returncode, res.stdout.strip()) == (0, "partial: nothing to repair")
    after = snapshot(d)
    after.pop("partial.diskqueue.lock")  # the lock taken while checking under it
    assert after == before


# ---------------------------------------------------------------------- a killed writer


PRODUCER = textwrap.dedent("""
    import asyncio, sys
    from aiodiskqueue import DiskQueue

    async def main():
        q = await DiskQueue.open(sys.argv[1], "crash", max_bytes_per_file=4096,
                                 sync_every=10**6, sync_interval=3600)
        await q.put(b"first")
        await q.sync()
        for i in range(500):
            await q.put(b"m-%04d" % i)
        print("written", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


async def test_killed_writer_leaves_stale_meta_that_repair_indexes(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PRODUCER, str(tmp_path), stdout=asyncio.subprocess.PIPE, env=env)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line == b"written\n"
        _, rep = await asyncio.to_thread(cli_json, "verify", tmp_path, "crash")
        assert rep["locked_by_pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    code, rep = await asyncio.to_thread(cli_json, "verify", tmp_path, "crash")
    assert code == 1
    assert [p["kind"] for p in rep["problems"]] == ["stale meta"]
    assert rep["problems"][0]["severity"] == "warning"
    assert "500 whole record(s)" in rep["problems"][0]["detail"]
    assert rep["locked_by_pid"] is None
    res = await asyncio.to_thread(cli, "repair", tmp_path, "crash")
    assert res.returncode == 0
    res = await asyncio.to_thread(cli, "verify", tmp_path, "crash")
    assert res.returncode == 0
    got, stats = await drain(tmp_path, "crash", max_bytes_per_file=4096)
    assert got == [b"first"] + [b"m-%04d" % i for i in range(500)]
    assert stats.recovered == 0


# ---------------------------------------------------------------------- queues written by DiskQueue


async def test_queue_closed_cleanly_verifies_sound(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "own", max_bytes_per_file=300) as q:
        await q.put_many([b"payload-%03d" % i for i in range(200)])
        for _ in range(57):
            await q.get()
        depth = q.qsize()
    res = await asyncio.to_thread(cli, "verify", tmp_path, "own")
    assert res.returncode == 0, res.stdout
    code, rep = await asyncio.to_thread(cli_json, "inspect", tmp_path, "own")
    assert code == 0
    assert rep["depth"] == rep["meta"]["depth"] == depth == 143
    res = await asyncio.to_thread(cli, "dump", tmp_path, "own", "--limit", "1")
    assert res.stdout == "payload-057\n"

    async with DiskQueue(tmp_path, "own", max_bytes_per_file=300) as q:
        await q.purge()
    code, rep = await asyncio.to_thread(cli_json, "verify", tmp_path, "own")
    assert (code, rep["depth"], rep["problems"]) == (0, 0, [])

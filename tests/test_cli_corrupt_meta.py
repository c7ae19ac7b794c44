"""The tools on metas that contradict the segments: every command ends, and dump,
verify and repair agree with the queue on where the unread records start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT as REPO
from helpers_format import meta_name, seg_name

from aiodiskqueue import DiskQueue


def cli(*args: object) -> subprocess.CompletedProcess[bytes]:
    # A hang is what these tests look for: 60 s is far beyond what any command needs.
    return subprocess.run([sys.executable, "-m", "aiodiskqueue", *map(str, args)],
                          capture_output=True, timeout=60, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), check=False)


def rec(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def files(directory: Path, segs: dict[int, bytes], meta: bytes) -> None:
    for num, data in segs.items():
        (directory / seg_name("q", num)).write_bytes(data)
    (directory / meta_name("q")).write_bytes(meta)


async def queue_reads(directory: Path) -> list[bytes]:
    async with DiskQueue(directory, "q") as q:
        return [await q.get() for _ in range(q.qsize())]


def dumped(directory: Path) -> list[bytes]:
    r = cli("dump", directory, "q", "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    return [o["payload"].encode() for o in map(json.loads, r.stdout.decode().splitlines())]


@pytest.mark.parametrize("meta", [b"1\n0,0\n1000000000000000000,7\n",
                                  b"1\n0,0\n10000000000000000000,7\n",
                                  b"1\n999999999999999999,0\n1000000000000000000,0\n",
                                  b"3\n5,0\n5,0\n"],
                         ids=["write-file-1e18", "write-file-1e19", "both-huge", "both-past"])
@pytest.mark.parametrize("command", ["verify", "inspect", "repair --dry-run", "dump"])
def test_every_command_ends_on_huge_meta_numbers(tmp_path: Path, meta: bytes,
                                                 command: str) -> None:
    files(tmp_path, {0: rec(b"a" * 10) + rec(b"b" * 10)}, meta)
    r = cli(*command.split(), tmp_path, "q")
    assert r.returncode in (0, 1), r.stderr
    if command == "dump":
        assert r.stdout.splitlines() == [b"a" * 10, b"b" * 10]
    elif command != "inspect":
        assert r.returncode == 1  # a problem is reported
    else:
        assert b"problems" in r.stdout


@pytest.mark.parametrize("meta", [b"28\n0,9\n0,60\n", b"3\n5,0\n5,0\n", b"0\n0,100\n1,0\n"],
                         ids=["read-inside-a-record", "both-past", "read-past-end"])
async def test_dump_verify_repair_and_queue_agree(tmp_path: Path, meta: bytes) -> None:
    # Four 11-byte records (15 bytes each) in segment 0, one in segment 1.
    msgs = [b"%02d" % i + b"." * 9 for i in range(5)]
    files(tmp_path, {0: b"".join(map(rec, msgs[:4])), 1: rec(msgs[4])}, meta)
    shown = dumped(tmp_path)
    v = json.loads(cli("verify", tmp_path, "q", "--json").stdout)
    r = cli("repair", tmp_path, "q")
    assert r.returncode in (0, 1), r.stderr
    got = await queue_reads(tmp_path)
    assert shown == got and v["depth"] == len(got)
    # 9 bytes in is inside record 0, which is delivered again; the other metas cannot
    # be trusted, so every record is counted from the first segment.
    assert got == msgs

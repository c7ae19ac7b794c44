"""The tools beside live roles: ``ls``, ``inspect`` and ``stats`` show the roles held and
both positions; ``verify`` reads only what the producer has published, takes no lock
that blocks a role, and does not call a record being written damage."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT
from test_cli import cli, cli_json

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.roles import read_record_at


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _write_segment(tmp_path: Path) -> Path:
    (seg,) = sorted(tmp_path.glob("q.diskqueue.0*.dat"))[-1:]
    return seg


async def _roles(tmp_path: Path) -> tuple[DiskQueue, DiskQueue]:
    p = await DiskQueue.open(tmp_path, "q", role="producer", max_bytes_per_file=1 << 20)
    c = await DiskQueue.open(tmp_path, "q", role="consumer", max_bytes_per_file=1 << 20,
                             sync_every=1)
    await p.put_many([b"msg-%03d" % i for i in range(30)])
    for i in range(10):
        assert await asyncio.wait_for(c.get(), 10) == b"msg-%03d" % i
    await c.sync()
    return p, c


async def test_ls_inspect_stats_show_both_roles_and_positions(tmp_path: Path) -> None:
    p, c = await _roles(tmp_path)
    lay = Layout(str(tmp_path), "q")
    try:
        prod = read_record_at(lay.role_path("producer"))
        cons = read_record_at(lay.role_path("consumer"))
        assert prod is not None and cons is not None
        assert prod.at == (0, 30 * 11)  # 4-byte length + 7 bytes each
        assert cons.at == (0, 10 * 11)
        want = {"producer": {"pid": os.getpid(), "write_file_num": 0, "write_pos": 330},
                "consumer": {"pid": os.getpid(), "read_file_num": 0, "read_pos": 110}}

        code, rows = await asyncio.to_thread(cli_json, "ls", tmp_path)
        assert code == 0
        (row,) = rows
        assert row["roles"] == want
        assert row["depth"] == 20
        assert (row["write_file_num"], row["write_pos"]) == (0, 330)
        res = await asyncio.to_thread(cli, "ls", tmp_path)
        header, line = res.stdout.splitlines()
        assert header.split()[-1] == "PRODUCER/CONSUMER"
        assert line.split()[-1] == f"{os.getpid()}/{os.getpid()}"

        code, rep = await asyncio.to_thread(cli_json, "inspect", tmp_path, "q")
        assert code == 0
        assert rep["roles"] == want
        assert rep["depth"] == 20
        text = (await asyncio.to_thread(cli, "inspect", tmp_path, "q")).stdout
        assert (f"roles     producer pid {os.getpid()} (published to 0,330), consumer pid "
                f"{os.getpid()} (read at 0,110)") in text

        res = await asyncio.to_thread(cli, "stats", tmp_path, "q", "--json")
        assert res.returncode == 0
        (s,) = [json.loads(x) for x in res.stdout.splitlines()]
        assert s["roles"] == want
        res = await asyncio.to_thread(cli, "stats", tmp_path, "q")
        assert f"(producer pid {os.getpid()} (published to 0,330)" in res.stdout
    finally:
        await p.aclose()
        await c.aclose()
    code, rows = cli_json("ls", tmp_path)
    assert rows[0]["roles"] == {"producer": None, "consumer": None}
    code, rep = cli_json("inspect", tmp_path, "q")
    assert rep["roles"] == {"producer": None, "consumer": None}
    assert "roles     none" in cli("inspect", tmp_path, "q").stdout


async def test_verify_beside_a_live_producer_ignores_the_record_being_written(
        tmp_path: Path) -> None:
    p, c = await _roles(tmp_path)
    try:
        seg = _write_segment(tmp_path)
        # The producer is writing its next record: its length is there, its body not yet.
        _append(seg, b"\0\0\0\x07msg")
        code, rep = await asyncio.to_thread(cli_json, "verify", tmp_path, "q")
        assert code == 0, rep
        assert rep["sound"] is True
        assert rep["depth"] == 20
        assert rep["roles"]["producer"]["pid"] == os.getpid()
        text = (await asyncio.to_thread(cli, "verify", tmp_path, "q")).stdout
        assert "sound (20 unread" in text
        assert "read up to 0,330, published" in text
        # verify left no lock behind: the consumer role can be taken again.
        await c.aclose()
        c = await DiskQueue.open(tmp_path, "q", role="consumer", max_bytes_per_file=1 << 20)
    finally:
        await c.aclose()
        await p.aclose()
    # The same bytes with no producer live: a torn tail, as before.
    code, rep = cli_json("verify", tmp_path, "q")
    assert code == 1
    assert [x["kind"] for x in rep["problems"]] == ["torn tail"]


async def test_verify_beside_a_live_producer_reads_no_further_segment(tmp_path: Path) -> None:
    p, c = await _roles(tmp_path)
    try:
        # A segment the producer has only begun (not yet published): garbage is not damage.
        (tmp_path / "q.diskqueue.000001.dat").write_bytes(b"\xff\xff")
        code, rep = await asyncio.to_thread(cli_json, "verify", tmp_path, "q")
        assert code == 0, rep
        assert rep["depth"] == 20
        code, rows = await asyncio.to_thread(cli_json, "ls", tmp_path)
        assert rows[0]["depth"] == 20
        assert (rows[0]["write_file_num"], rows[0]["write_pos"]) == (0, 330)
    finally:
        os.unlink(tmp_path / "q.diskqueue.000001.dat")
        await c.aclose()
        await p.aclose()


async def test_verify_still_finds_damage_in_published_data(tmp_path: Path) -> None:
    p, c = await _roles(tmp_path)
    try:
        seg = _write_segment(tmp_path)
        with open(seg, "r+b") as f:
            f.seek(20 * 11)
            f.write(b"\xff\xff\xff\xff")  # a length field inside what is published
        code, rep = await asyncio.to_thread(cli_json, "verify", tmp_path, "q")
        assert code == 1
        assert "bad length" in [x["kind"] for x in rep["problems"]]
    finally:
        await c.aclose()
        await p.aclose()


_PRODUCER = """
import asyncio, sys
from aiodiskqueue import DiskQueue

async def main():
    async with DiskQueue(sys.argv[1], "q", "producer", max_bytes_per_file=4096) as p:
        print("OPEN", flush=True)
        i = 0
        while True:
            await p.put(b"m-%06d" % i + b"x" * (i % 97))
            i += 1
            if i % 50 == 0:
                await asyncio.sleep(0.001)

asyncio.run(main())
"""


async def test_verify_and_ls_beside_a_producer_and_consumer_at_work(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _PRODUCER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        assert await asyncio.to_thread(proc.stdout.readline) == "OPEN\n"
        c = await DiskQueue.open(tmp_path, "q", role="consumer", max_bytes_per_file=4096,
                                 sync_every=1)
        got = 0
        stop = asyncio.Event()

        async def consume() -> None:
            nonlocal got
            while not stop.is_set():
                m = await asyncio.wait_for(c.get(), 10)
                assert m.startswith(b"m-%06d" % got)
                got += 1

        task = asyncio.create_task(consume())
        try:
            for _ in range(4):
                code, rep = await asyncio.to_thread(cli_json, "verify", tmp_path, "q")
                assert code == 0, rep["problems"]
                assert rep["roles"]["producer"]["pid"] == proc.pid
                assert rep["roles"]["consumer"]["pid"] == os.getpid()
                code, rows = await asyncio.to_thread(cli_json, "ls", tmp_path)
                assert code == 0
                assert rows[0]["roles"]["producer"]["pid"] == proc.pid
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await c.aclose()
        assert got > 0
        assert len(list(tmp_path.glob("q.diskqueue.0*.dat"))) < 200  # consumed ones go
    finally:
        proc.kill()
        proc.wait()

"""Typed end to end: ``mypy --strict`` infers ``T`` of a typed queue from its serializer.

The ``assert_type`` calls are checked by mypy (the last test runs it over this file)
and are no-ops at run time, where the same code runs as an ordinary test.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import assert_type

from aiodiskqueue import DiskQueue
from aiodiskqueue.serializers import JsonSerializer, MsgpackSerializer, PickleSerializer, Serializer
from aiodiskqueue.sync import DiskQueue as SyncDiskQueue
from aiodiskqueue.typed import SyncTypedQueue, TypedQueue

REPO = Path(__file__).resolve().parent.parent


class Celsius:
    """A user serializer: any class with dumps/loads is a Serializer."""

    def dumps(self, value: float, /) -> bytes:
        return repr(value).encode()

    def loads(self, data: bytes, /) -> float:
        return float(data)


async def test_types_follow_the_serializer(tmp_path: Path) -> None:
    async with TypedQueue(DiskQueue(tmp_path, "j"), JsonSerializer[dict[str, int]]()) as q:
        assert_type(q, TypedQueue[dict[str, int]])
        await q.put({"a": 1})
        assert_type(await q.get(), dict[str, int])
        await q.put({"b": 2})
        assert_type(await q.get_many(3), list[dict[str, int]])
    async with await TypedQueue.open(tmp_path, "c", Celsius()) as c:
        await c.put(21.5)
        assert_type(await c.get(), float)
        c.put_nowait(3.0)
        while not c.statistics().ready:  # wait for the read-ahead to hand it over
            await asyncio.sleep(0.001)
        assert_type(c.get_nowait(), float)
    p = await TypedQueue.open(tmp_path, "p", PickleSerializer[tuple[int, str]]())
    await p.put((1, "a"))
    async for item in p:
        assert_type(item, tuple[int, str])
        break
    await p.aclose()
    ser: Serializer[list[bytes]] = MsgpackSerializer[list[bytes]]()
    m = await TypedQueue.open(tmp_path, "m", ser)
    await m.put([b"x"])
    assert_type(await m.get(), list[bytes])
    await m.aclose()


def test_sync_types_follow_the_serializer(tmp_path: Path) -> None:
    with SyncTypedQueue(SyncDiskQueue(tmp_path, "s"), JsonSerializer[list[str]]()) as q:
        q.put_many([["a"], ["b"]])
        assert_type(q.get(), list[str])
        for item in q:
            assert_type(item, list[str])
            break


WRONG = '''
from pathlib import Path
from aiodiskqueue import DiskQueue
from aiodiskqueue.serializers import JsonSerializer
from aiodiskqueue.typed import TypedQueue

async def main(d: Path) -> None:
    q = TypedQueue(DiskQueue(d, "x"), JsonSerializer[dict[str, int]]())
    await q.put(["not", "a", "dict"])
    s: str = await q.get()
'''


def _mypy(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
                           *map(str, paths)], capture_output=True, text=True, cwd=REPO,
                          timeout=600, check=False)


def test_mypy_strict_accepts_this_file_and_rejects_wrong_types(tmp_path: Path) -> None:
    ok = _mypy(Path(__file__))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "wrong.py"
    bad.write_text(WRONG)
    out = _mypy(bad)
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert any('Argument 1 to "put" of "TypedQueue" has incompatible type "list[str]"' in ln
               for ln in lines), out.stdout
    assert any('Incompatible types in assignment (expression has type "dict[str, int]", '
               'variable has type "str")' in ln for ln in lines), out.stdout

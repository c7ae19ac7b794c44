"""The same queue under uvloop (the ``uvloop`` extra): roll, reopen, many tasks, cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import uvloop  # the uvloop extra: `bash dev.sh test` installs it, so this never skips
from helpers_format import layout, read_queue, seg_name

from aiodiskqueue import DiskQueue, QueueClosed


def run(coro_fn: object, *args: object) -> None:
    """Run ``coro_fn(*args)`` on a fresh uvloop event loop."""
    assert callable(coro_fn)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert "uvloop" in type(runner.get_loop()).__module__
        runner.run(coro_fn(*args))


async def _roundtrip(directory: Path) -> None:
    msgs = [b"u%04d" % i + b"-" * (i % 40) for i in range(500)]
    async with DiskQueue(directory, "q", max_bytes_per_file=1000, sync_every=1) as q:
        producers = [q.put_many(msgs[i:i + 50]) for i in range(0, 500, 50)]
        for p in producers:  # one after the other: order is the list order
            await p
        assert [await q.get() for _ in range(100)] == msgs[:100]
    files, _ = layout(msgs, 1000)
    assert read_queue(directory, "q") == msgs[100:]
    last = max(files)
    assert (directory / seg_name("q", last)).read_bytes() == files[last]
    async with DiskQueue(directory, "q", max_bytes_per_file=1000) as q:
        getters = [asyncio.create_task(q.get()) for _ in range(10)]
        await asyncio.sleep(0)
        getters[3].cancel()
        got = [await g for i, g in enumerate(getters) if i != 3]
        rest = [await q.get() for _ in range(q.qsize())]
        assert sorted(got + rest) == sorted(msgs[100:]) and len(got + rest) == 400
        assert rest == sorted(rest)
        blocked = asyncio.create_task(q.get())
        await asyncio.sleep(0)
        q.shutdown()
        with pytest.raises(QueueClosed):
            await blocked


def test_uvloop_roundtrip_roll_reopen_cancel(tmp_path: Path) -> None:
    run(_roundtrip, tmp_path)

"""examples/web_ingest.py: 202 only after the put returned, the worker drains, the
load run stops; ``serve --workers 2`` writes one group that its consumer process drains."""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import pytest
from aiohttp import ClientSession, web

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.group import group_layout
from aiodiskqueue._format.meta import load_meta

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "web_ingest.py"


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("web_ingest_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


web_ingest = _load_example()


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[str, DiskQueue]]:
    """The ingest app on an ephemeral loopback port over a queue in ``tmp_path``."""
    async with DiskQueue(tmp_path, "ingest") as q:
        runner = web.AppRunner(web_ingest.make_app(q), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = getattr(site._server, "sockets", [])[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}", q
        finally:
            await runner.cleanup()


async def test_post_is_accepted_and_drained(service: tuple[str, DiskQueue]) -> None:
    url, q = service
    async with ClientSession() as s:
        for i in range(20):
            async with s.post(url + "/ingest", data=b"event %d" % i) as resp:
                assert resp.status == 202
        async with s.post(url + "/ingest", data=b"") as resp:
            assert resp.status == 400

        async def processed() -> int:
            async with s.get(url + "/stats") as resp:
                stats: dict[str, int] = await resp.json()
            return stats["processed"]

        for _ in range(2000):  # poll the service's own count, bounded
            if await processed() == 20:
                break
            await asyncio.sleep(0.01)
        assert await processed() == 20
    assert q.statistics().puts == 20


async def test_accepted_posts_survive_a_restart(tmp_path: Path) -> None:
    # The worker is not started here: what was accepted must be on disk.
    async with DiskQueue(tmp_path, "ingest") as q:
        app = web_ingest.make_app(q)
        app.cleanup_ctx.clear()
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = getattr(site._server, "sockets", [])[0].getsockname()[1]
        async with ClientSession() as s:
            for i in range(5):
                async with s.post(f"http://127.0.0.1:{port}/ingest", data=b"e%d" % i) as resp:
                    assert resp.status == 202
        await runner.cleanup()
    async with DiskQueue(tmp_path, "ingest") as q:
        assert [await q.get() for _ in range(5)] == [b"e%d" % i for i in range(5)]


async def test_load_generator_is_bounded(service: tuple[str, DiskQueue]) -> None:
    url, _ = service
    result = await web_ingest.load(url + "/ingest", 60, 6, 100)
    assert (result.requests, result.errors) == (60, 0)
    assert result.p99_ms >= result.p50_ms > 0


@pytest.mark.slow  # 3-8 s here: three spawned processes start Python and aiohttp
async def test_serve_workers_writes_one_group_drained_by_a_consumer_process(
        tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE), "serve", "--data-dir", str(tmp_path), "--port", "0",
        "--workers", "2", stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith("LISTENING "), line
        url = f"http://127.0.0.1:{line.split()[1]}"
        async with ClientSession() as s:
            for i in range(40):
                async with s.post(url + "/ingest", data=b"event %d" % i) as resp:
                    assert resp.status == 202
            for _ in range(3000):  # the consumer process's count, bounded
                async with s.get(url + "/stats") as resp:
                    stats = await resp.json()
                if stats["processed"] == 40:
                    break
                await asyncio.sleep(0.01)
        # Every worker answers with the counts of all processes.
        assert (stats["accepted"], stats["processed"], stats["pending"]) == (40, 40, 0)
        assert stats["shard"] in ("000000", "000001")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    # Each worker process claimed a shard of its own before it served.
    shards = group_layout(tmp_path, "ingest").shards()
    assert len(shards) == 2
    for num in shards:
        meta = load_meta(group_layout(tmp_path, "ingest").shard_layout(num).meta_path)
        assert meta is not None and meta.depth == 0  # the consumer stored its positions

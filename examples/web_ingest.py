"""Web ingest on aiodiskqueue: an aiohttp service that accepts a POST only once it is stored.

Three modes:

``serve``  run the service: ``POST /ingest`` puts the request body into a
           :class:`~aiodiskqueue.DiskQueue` and answers ``202 Accepted`` only
           after ``await q.put(body)`` returned, so an accepted request
           survives a crash of the service (with ``--sync-every 1``, a power
           loss too). A separate worker task drains the queue with
           ``async for``. ``GET /stats`` shows the counts.

           ``--workers N`` runs N service processes on one listening socket, as
           ``uvicorn --workers N`` or gunicorn do, each a producer of the queue
           group ``ingest`` (:class:`~aiodiskqueue.QueueGroup`: every worker claims
           a shard of its own, no configuration per worker), and one separate
           consumer process that reads the whole group.

``load``   a bounded load generator: N requests from C concurrent clients
           over loopback against a running service; prints requests/s and
           latency percentiles, then stops.

``bench``  start the service as a subprocess with an in-memory asyncio.Queue
           (the anchor: nothing stored), with the default sync policy and
           with ``sync_every=1``, and with ``--workers`` processes writing a
           group (``--workers 0`` leaves that row out); load each, print the results.

    python examples/web_ingest.py serve --data-dir /tmp/ingest --port 8080
    python examples/web_ingest.py serve --data-dir /tmp/ingest --port 8080 --workers 4
    python examples/web_ingest.py load --url http://127.0.0.1:8080/ingest -n 20000 -c 64
    python examples/web_ingest.py bench -n 20000 -c 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import ClientSession, TCPConnector, web

from aiodiskqueue import DiskQueue, QueueClosed, QueueGroup

# ---------------------------------------------------------------------- service

class IngestQueue(Protocol):
    """What the service needs from its queue (a DiskQueue, or the in-memory anchor)."""

    async def put(self, item: bytes) -> None: ...
    def qsize(self) -> int: ...
    def __aiter__(self) -> AsyncIterator[bytes]: ...


class MemoryQueue(asyncio.Queue[bytes]):
    """The anchor: an asyncio.Queue, nothing stored; a crash loses every accepted request."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        return await self.get()


def make_app(queue: IngestQueue) -> web.Application:
    """The ingest application over an open ``queue``; its worker starts with the app."""
    counts = {"accepted": 0, "processed": 0}

    async def ingest(request: web.Request) -> web.Response:
        body = await request.read()
        if not body:
            return web.json_response({"error": "empty body"}, status=400)
        try:
            await queue.put(body)
        except QueueClosed:
            return web.json_response({"error": "shutting down"}, status=503)
        counts["accepted"] += 1
        return web.Response(status=202)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({**counts, "depth": queue.qsize()})

    async def worker() -> None:
        async for _body in queue:
            # Real work would go here; the message is consumed once get() returned.
            counts["processed"] += 1

    async def run_worker(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(worker())
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    app = web.Application()
    app.router.add_post("/ingest", ingest)
    app.router.add_get("/stats", stats)
    app.cleanup_ctx.append(run_worker)
    return app


async def serve(data_dir: str, host: str, port: int, sync_every: int, memory: bool = False) -> None:
    """Serve until SIGINT/SIGTERM; print ``LISTENING <port>`` once ready.

    ``memory=True`` uses an asyncio.Queue instead (the benchmark's anchor).
    """
    stop = _stop_event()

    async def run(queue: IngestQueue) -> None:
        runner = web.AppRunner(make_app(queue), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        real_port = sockets[0].getsockname()[1] if sockets else port
        print(f"LISTENING {real_port}", flush=True)
        await stop.wait()
        await runner.cleanup()

    if memory:
        await run(MemoryQueue())
        return
    async with DiskQueue(data_dir, "ingest", sync_every=sync_every) as queue:
        await run(queue)


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


# ---------------------------------------------------------------------- worker processes

GROUP = "ingest"


@dataclass
class Shared:
    """Counters every process of ``serve --workers`` sees (shared memory, one writer each):
    requests accepted by each worker, messages processed by the consumer."""

    accepted: Any  # multiprocessing Array of int64, one slot per worker
    processed: Any  # multiprocessing Value of int64
    ready: Any  # multiprocessing Queue: each child puts its pid once it is serving

    def counts(self) -> dict[str, int]:
        """What ``GET /stats`` answers in every worker."""
        accepted = sum(self.accepted)
        processed = int(self.processed.value)
        return {"accepted": accepted, "processed": processed, "pending": accepted - processed}


async def _worker_main(data_dir: str, sock: socket.socket, index: int, shared: Shared,
                       sync_every: int) -> None:
    """One service process: a producer of the group, on the shared listening socket."""
    stop = _stop_event()

    async def ingest(request: web.Request) -> web.Response:
        body = await request.read()
        if not body:
            return web.json_response({"error": "empty body"}, status=400)
        try:
            await group.put(body)
        except QueueClosed:
            return web.json_response({"error": "shutting down"}, status=503)
        shared.accepted[index] += 1
        return web.Response(status=202)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({**shared.counts(), "worker": index, "pid": os.getpid(),
                                  "shard": group.shard})

    async with QueueGroup(data_dir, GROUP, "producer", sync_every=sync_every) as group:
        app = web.Application()
        app.router.add_post("/ingest", ingest)
        app.router.add_get("/stats", stats)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        shared.ready.put(os.getpid())
        await stop.wait()
        await runner.cleanup()


async def _consumer_main(data_dir: str, shared: Shared) -> None:
    """The consumer process: reads the whole group, shards taking turns."""
    stop = _stop_event()
    async with QueueGroup(data_dir, GROUP, "consumer") as group:
        shared.ready.put(os.getpid())

        async def drain() -> None:
            async for _body in group:
                # Real work would go here; the message is consumed once get() returned.
                shared.processed.value += 1

        task = asyncio.create_task(drain())
        await stop.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


def _run_worker(*args: Any) -> None:
    asyncio.run(_worker_main(*args))


def _run_consumer(*args: Any) -> None:
    asyncio.run(_consumer_main(*args))


def serve_workers(data_dir: str, host: str, port: int, sync_every: int, workers: int) -> None:
    """``serve --workers N``: N service processes on one listening socket, each a producer of
    the group ``ingest`` in ``data_dir``, and one consumer process; print ``LISTENING
    <port>`` once all are ready; stop them all on SIGINT/SIGTERM.

    Raises RuntimeError if a process dies before it is ready.
    """
    ctx = multiprocessing.get_context("spawn")
    shared = Shared(ctx.Array("q", workers, lock=False), ctx.Value("q", 0, lock=False),
                    ctx.Queue())
    sock = socket.create_server((host, port), backlog=1024)
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    children = [ctx.Process(target=_run_consumer, args=(data_dir, shared), name="consumer")]
    children += [ctx.Process(target=_run_worker, args=(data_dir, sock, i, shared, sync_every),
                             name=f"worker-{i}") for i in range(workers)]
    try:
        for child in children:
            child.start()
        for _ in children:
            _wait_ready(shared, children, lambda: stopping)
        print(f"LISTENING {sock.getsockname()[1]}", flush=True)
        while not stopping and all(c.is_alive() for c in children):
            time.sleep(0.1)
    finally:
        sock.close()
        # Workers first, so that what they accepted is in the group; then the consumer.
        for group in (children[1:], children[:1]):
            for child in group:
                if child.pid is not None and child.is_alive():
                    os.kill(child.pid, signal.SIGTERM)
            for child in group:
                child.join(30)


def _wait_ready(shared: Shared, children: list[Any], stopping: Callable[[], bool]) -> None:
    while True:
        try:
            shared.ready.get(timeout=0.2)
            return
        except queue.Empty:
            if stopping():
                return
            dead = [c.name for c in children if c.pid is not None and not c.is_alive()]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited before it was ready") from None


# ---------------------------------------------------------------------- load

@dataclass(frozen=True)
class LoadResult:
    """What one load run measured."""

    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def rate(self) -> float:
        """Completed requests per second."""
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


async def load(url: str, total: int, concurrency: int, size: int) -> LoadResult:
    """POST ``total`` bodies of ``size`` bytes from ``concurrency`` clients; stops by itself."""
    body = os.urandom(size // 2).hex().encode()[:size] or b"x"
    latencies: list[float] = []
    errors = 0
    remaining = total

    async with ClientSession(connector=TCPConnector(limit=concurrency)) as session:
        async def client() -> None:
            nonlocal remaining, errors
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                async with session.post(url, data=body) as resp:
                    await resp.read()
                    if resp.status != 202:
                        errors += 1
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    latencies.sort()
    return LoadResult(len(latencies), errors, elapsed,
                      _percentile(latencies, 0.50) * 1000, _percentile(latencies, 0.99) * 1000)


# ---------------------------------------------------------------------- bench

def _start_service(data_dir: str, sync_every: int,
                   workers: int = 0) -> tuple[subprocess.Popen[str], int]:
    """sync_every=0 starts the in-memory anchor; ``workers`` > 0 the group setup."""
    mode = ["--memory"] if sync_every == 0 else ["--sync-every", str(sync_every)]
    if workers:
        mode += ["--workers", str(workers)]
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "serve", "--data-dir", data_dir,
         "--port", "0", *mode],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("LISTENING "):
        proc.kill()
        raise RuntimeError(f"service did not start: {line!r}")
    return proc, int(line.split()[1])


async def _wait_drained(port: int, expected: int, timeout: float = 60.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    async with ClientSession() as session:
        while True:
            async with session.get(f"http://127.0.0.1:{port}/stats") as resp:
                stats: dict[str, int] = await resp.json()
            if stats["processed"] >= expected or time.monotonic() > deadline:
                return stats
            await asyncio.sleep(0.05)


async def bench(total: int, concurrency: int, size: int,
                workers: int = 0) -> list[tuple[str, LoadResult]]:
    """Load the in-memory anchor, then the service: default sync policy, ``sync_every=1``,
    and (``workers`` > 0) that many worker processes writing a group, with a consumer
    process."""
    out: list[tuple[str, LoadResult]] = []
    rows = [("asyncio.Queue (no disk)", 0, 0), ("default (sync_every=2500)", 2500, 0),
            ("sync_every=1", 1, 0)]
    if workers:
        rows.append((f"group, {workers} workers + consumer", 2500, workers))
    for label, sync_every, procs in rows:
        with tempfile.TemporaryDirectory() as d:
            proc, port = _start_service(d, sync_every, procs)
            try:
                await load(f"http://127.0.0.1:{port}/ingest", min(500, total), concurrency, size)
                result = await load(f"http://127.0.0.1:{port}/ingest", total, concurrency, size)
                stats = await _wait_drained(port, total + min(500, total))
                if stats["processed"] < stats["accepted"]:
                    raise RuntimeError(f"worker did not drain: {stats}")
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            out.append((label, result))
    return out


def _print(label: str, r: LoadResult) -> None:
    print(f"{label:28} {r.requests:7d} requests  {r.rate:9.0f} req/s  p50 {r.p50_ms:6.2f} ms  "
          f"p99 {r.p99_ms:6.2f} ms  errors {r.errors}")


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--data-dir", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--sync-every", type=int, default=2500)
    s.add_argument("--memory", action="store_true", help="asyncio.Queue instead (no persistence)")
    s.add_argument("--workers", type=int, default=0, metavar="N",
                   help="N service processes writing the queue group 'ingest', and a "
                        "consumer process (default 0: one process, one queue)")
    for name in ("load", "bench"):
        lp = sub.add_parser(name)
        if name == "load":
            lp.add_argument("--url", required=True)
        else:
            lp.add_argument("--workers", type=int, default=4, metavar="N",
                            help="worker processes of the group row (0: leave it out)")
        lp.add_argument("-n", "--requests", type=int, default=20_000)
        lp.add_argument("-c", "--concurrency", type=int, default=64)
        lp.add_argument("--size", type=int, default=1024)
        lp.add_argument("--json", action="store_true", help="print results as JSON")
    args = p.parse_args(argv)
    if args.mode == "serve":
        if args.workers < 0 or (args.workers and args.memory):
            p.error("--workers must be >= 0, and does not go with --memory")
        if args.workers:
            serve_workers(args.data_dir, args.host, args.port, args.sync_every, args.workers)
        else:
            asyncio.run(serve(args.data_dir, args.host, args.port, args.sync_every,
                              args.memory))
        return 0
    if args.mode == "load":
        result = asyncio.run(load(args.url, args.requests, args.concurrency, args.size))
        results = [("load", result)]
    else:
        results = asyncio.run(bench(args.requests, args.concurrency, args.size, args.workers))
    if args.json:
        print(json.dumps({k: {**vars(r), "rate": r.rate} for k, r in results}))
    else:
        for label, r in results:
            _print(label, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())

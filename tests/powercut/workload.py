"""A workload on the simulated disk, killed at a random moment; run as
``python workload.py KIND DIR REPORT SEED``.

Each line of REPORT (a file outside the mount, one ``os.write`` a line, so a kill
loses none that was written) says what the queue acknowledged:

- ``T p n`` before producer ``p`` puts its ``n``-th message, ``A p n`` once the put
  returned;
- ``G p n`` once a consumer took it (DiskQueue), ``E`` once it took an empty
  message; ``D p n`` once an AckQueue consumer got it, ``B p n``/``F p n`` before and
  after its ``finish()``;
- ``SB``/``SE`` before and after ``await q.sync()``; ``PB``/``PE`` around ``purge()``;
- ``READY`` once the queue is open.

Kinds: ``sync1`` (DiskQueue, ``sync_every=1``, three producers, one consumer, 4 KiB
segments), ``default`` (DiskQueue's default sync settings with ``sync()`` calls),
``ack`` (AckQueue, ``sync_every=1``: finish, requeue, time-outs, dead letters),
``ackdefault`` (the same with the default sync settings and ``sync()`` calls),
``purge`` (DiskQueue, ``sync_every=1``, a producer that purges now and then),
``empty`` (``sync1`` whose producer ``EMPTY_PRODUCER`` puts only empty messages, so
the queue has its empty-message marker: they cannot be told apart, only counted),
``repair`` (``python -m aiodiskqueue repair`` on a queue left durable but stale),
``roles`` (``sync1`` with a producer object and a consumer object, ``role="producer"``
and ``role="consumer"``, each with its own files and meta stores; the images are opened
as ``"both"``), ``procs`` (the same roles in two processes, cut at once), ``spark`` (Spark
batch writes committed by the writer's own code, see :func:`spark`), ``broker`` and
``brokerdefault`` (NSQ clients publishing to a broker process whose data directory is
on the mount, ``sync_every=1`` and the default settings, see :func:`broker`),
``produce`` (``sync1`` without a consumer: the self-test of a lost synced write) and
``liar`` (like ``sync1``, but it reports a put before it makes it: the self-test).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import random
import sys
import tempfile
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiodiskqueue import DiskQueue

QUEUE = "q"
MAX_ATTEMPTS = 2  # the AckQueue workloads'
PRODUCERS = 3
EMPTY_PRODUCER = 2  # in the ``empty`` workload, this producer puts b"" only


async def produce_forever(put: Callable[[bytes], Awaitable[object]], p: int, out: Report,
                          rng: random.Random) -> None:
    """Producer ``p``: put its numbered messages one by one, reporting each before
    (``T``) and once acknowledged (``A``), until the kill."""
    for n in range(1 << 30):
        out("T", p, n)
        await put(payload(p, n))
        out("A", p, n)
        if rng.random() < 0.2:
            await asyncio.sleep(0.001)


def payload(p: int, n: int) -> bytes:
    """The message producer ``p`` puts ``n``-th: its name, then bytes derived from it."""
    head = f"{p}:{n}:".encode()
    size = (n * 37 + p * 101) % 300
    seed = hashlib.blake2b(head, digest_size=32).digest()
    return head + (seed * (size // 32 + 1))[:size]


def parse(body: bytes) -> tuple[int, int] | None:
    """``(p, n)`` if ``body`` is exactly what :func:`payload` makes for them."""
    try:
        p, n, _ = body.split(b":", 2)
        key = int(p), int(n)
    except ValueError:
        return None
    return key if payload(*key) == body else None


class Report:
    """The report file: one write a line."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, *words: object) -> None:
        os.write(self.fd, (" ".join(map(str, words)) + "\n").encode())


async def diskqueue(kind: str, directory: str, out: Report, rng: random.Random) -> None:
    from aiodiskqueue import DiskQueue

    opts: dict[str, int] = {"max_bytes_per_file": 4096}
    if kind != "default":
        opts["sync_every"] = 1
    else:
        opts["max_bytes_per_file"] = 8192
    if kind == "roles":
        kw: dict[str, object] = dict(opts)
        pq = DiskQueue(directory, QUEUE, role="producer", **kw)  # type: ignore[arg-type]
        cq = DiskQueue(directory, QUEUE, role="consumer", **kw)  # type: ignore[arg-type]
        async with pq, cq:
            out("READY")
            await _produce_consume(kind, pq, cq, out, rng)
        return
    async with DiskQueue(directory, QUEUE, **opts) as q:  # type: ignore[arg-type]
        out("READY")
        await _produce_consume(kind, q, q, out, rng)


async def _produce_consume(kind: str, q: DiskQueue, cq: DiskQueue, out: Report,
                           rng: random.Random) -> None:
    """Producers put into ``q``, a consumer takes from ``cq`` (the same object but for
    the ``roles`` workload), until the kill."""

    async def produce(p: int) -> None:
        for n in range(1 << 30):
            if kind == "liar":
                out("A", p, n)  # acknowledged before it is written: must be caught
                await asyncio.sleep(0.01)
            out("T", p, n)
            await q.put(b"" if kind == "empty" and p == EMPTY_PRODUCER else payload(p, n))
            if kind != "liar":
                out("A", p, n)
            if kind == "purge" and rng.random() < 0.05:
                out("PB")
                await q.purge()
                out("PE")
            if rng.random() < 0.2:
                await asyncio.sleep(0.001)

    async def consume() -> None:
        while True:
            body = await cq.get()
            key = parse(body)
            if not body and kind == "empty":
                out("E")
            else:
                out("G", *(key if key else ("?", "?")))
            if rng.random() < 0.3:
                await asyncio.sleep(0.003)

    async def syncer() -> None:
        while True:
            await asyncio.sleep(rng.uniform(0.005, 0.03))
            out("SB")
            await q.sync()
            out("SE")

    producers = 1 if kind == "purge" else PRODUCERS
    tasks = [produce(p) for p in range(producers)]
    if kind != "produce":
        tasks.append(consume())
    if kind == "default":
        tasks.append(syncer())
    await asyncio.gather(*tasks)


async def ackqueue(kind: str, directory: str, out: Report, rng: random.Random) -> None:
    from aiodiskqueue import AckQueue
    from aiodiskqueue._core.options import DEFAULTS

    sync_every = 1 if kind == "ack" else DEFAULTS.sync_every
    async with AckQueue(directory, QUEUE, max_attempts=MAX_ATTEMPTS, msg_timeout=0.02,
                        max_bytes_per_file=4096, log_segment_bytes=4096,
                        sync_every=sync_every) as q:
        out("READY")

        async def syncer() -> None:
            while True:
                await asyncio.sleep(rng.uniform(0.005, 0.03))
                out("SB")
                await q.sync()
                out("SE")

        async def produce(p: int) -> None:
            await produce_forever(q.put, p, out, rng)

        async def consume() -> None:
            while True:
                msg = await q.get()
                key = parse(msg.body) or ("?", "?")
                out("D", *key)
                r = rng.random()
                if r < 0.6:
                    out("B", *key)
                    await msg.finish()
                    out("F", *key)
                elif r < 0.8:
                    await msg.requeue()
                # else: left to time out (a second delivery dead-letters it)

        tasks = [produce(0), produce(1), consume()]
        if kind != "ack":
            tasks.append(syncer())
        await asyncio.gather(*tasks)


def _durable_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def repair(directory: str, out: Report, rng: random.Random) -> None:
    """Leave a queue that needs repair, durably, then become ``aiodiskqueue repair``:
    a meta whose write position is behind, records past it in two segments, a torn
    record at the end, a leftover meta temp file."""
    from aiodiskqueue._format.layout import Layout
    from aiodiskqueue._format.meta import Meta

    lay = Layout(directory, QUEUE)
    n = 0
    first = 0  # records in segment 0: what the meta's write position (1, 0) covers
    for num in range(3):
        data = b""
        for _ in range(rng.randint(5, 40)):
            body = payload(0, n)
            data += len(body).to_bytes(4, "big") + body
            out("T", 0, n)
            out("A", 0, n)  # durable below, before the repair starts
            n += 1
        if num == 2:
            data += (500).to_bytes(4, "big") + b"torn"  # a record cut short
        _durable_file(lay.segment_path(num), data)
        if num == 0:
            first = n
    _durable_file(lay.meta_path, Meta(first, 0, 0, 1, 0).encode())
    _durable_file(lay.meta_path + ".4242.tmp", b"half a meta")
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    out("READY")
    os.execv(sys.executable, [sys.executable, "-m", "aiodiskqueue", "repair", "--no-progress",
                              directory, QUEUE])


# ---------------------------------------------------------------------- spark

SPARK_EARLIER = 0  # the producer of the messages put before the Spark jobs
SPARK_TASKS = 3


def spark(directory: str, out: Report, rng: random.Random) -> None:
    """Spark batch writes, one job after another, each committed by the writer's own
    code: a ``DiskQueueWriter`` made as ``df.write.format("diskqueue")...save()`` makes it
    on the driver, its ``write`` for each task (staged files, fsynced), its ``commit``
    with the tasks' messages (renames, one meta). No JVM: the commit protocol is all
    Python, and Spark's part (calling these in this order) cannot reach the disk.

    Job ``j`` writes ``payload(j, n)``; ``J j k`` before its commit says it holds ``k``
    messages and ``S j a b ...`` where its staged files end (in messages); ``C j``
    before the commit, ``A j n`` for each message once it returned. Earlier content:
    messages of producer 0, put with ``sync_every=1``; half the runs leave a torn
    record durably at the end, which the commit cuts.
    """
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql.datasource import WriterCommitMessage
    from pyspark.sql.types import BinaryType, StructField, StructType

    from aiodiskqueue import DiskQueue
    from aiodiskqueue._format.layout import Layout
    from aiodiskqueue.spark import DiskQueueDataSource

    async def earlier() -> None:
        async with DiskQueue(directory, QUEUE, sync_every=1, max_bytes_per_file=4096) as q:
            for n in range(rng.randint(0, 60)):
                out("T", SPARK_EARLIER, n)
                await q.put(payload(SPARK_EARLIER, n))
                out("A", SPARK_EARLIER, n)

    asyncio.run(earlier())
    lay = Layout(directory, QUEUE)
    segs = lay.segments()
    if segs and rng.random() < 0.5:
        fd = os.open(segs[max(segs)], os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (300).to_bytes(4, "big") + b"torn")
            os.fsync(fd)
        finally:
            os.close(fd)
    schema = StructType([StructField("payload", BinaryType())])
    # The first write imports a lot (over a second): warm up off the mount.
    with tempfile.TemporaryDirectory() as scratch:
        w = DiskQueueDataSource({"path": scratch, "name": QUEUE}).writer(schema, False)
        w.commit([w.write(iter([pa.record_batch([pa.array([b"warm"], pa.binary())],
                                                names=["payload"])]))])
    source = DiskQueueDataSource({"path": directory, "name": QUEUE,
                                  "maxBytesPerFile": "4096"})
    out("READY")
    for j in range(1, 1 << 30):
        k = rng.randint(1, 120)
        for n in range(k):
            out("T", j, n)
        writer = source.writer(schema, False)
        cuts = sorted(rng.sample(range(k + 1), SPARK_TASKS - 1))
        bounds = [0, *cuts, k]
        messages: list[WriterCommitMessage | None] = []
        ends: list[int] = []
        for lo, hi in itertools.pairwise(bounds):  # one task per slice, as Spark would
            rows = [payload(j, n) for n in range(lo, hi)]
            batches = [pa.record_batch([pa.array(rows[i:i + 25], pa.binary())],
                                       names=["payload"]) for i in range(0, len(rows), 25)]
            msg = writer.write(iter(batches))
            messages.append(msg)
            for f in msg.files:
                ends.append((ends[-1] if ends else 0) + f.records)
        out("J", j, k)
        out("S", j, *ends)
        out("C", j)
        writer.commit(messages)
        for n in range(k):
            out("A", j, n)


# ---------------------------------------------------------------------- two processes


def procs(directory: str, report: str, seed: str, out: Report) -> None:
    """The roles as two processes (``sync1`` per role): this one opens the producer
    role (creating the queue), starts a consumer process, waits until that opened its
    role, then produces; the cut kills both at once."""
    import subprocess
    import time

    def start_consumer() -> None:
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__),
                                  "procs-consumer", directory, report, seed])
        deadline = time.monotonic() + 30
        while True:
            with open(report, "rb") as f:
                if b"OPEN consumer\n" in f.read():
                    return
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the consumer process did not open its role")
            time.sleep(0.005)

    asyncio.run(procs_role("producer", directory, out, random.Random(int(seed)),
                           start_consumer))


async def procs_role(role: str, directory: str, out: Report, rng: random.Random,
                     opened: Callable[[], None] | None = None) -> None:
    """One side of ``procs``: three producers, or a consumer (``role``); ``opened``
    runs once the role is open."""
    from aiodiskqueue import DiskQueue

    async with DiskQueue(directory, QUEUE, role=role, sync_every=1,
                         max_bytes_per_file=4096) as q:
        if opened is not None:
            opened()
        if role == "consumer":
            out("OPEN consumer")
            while True:
                body = await q.get()
                out("G", *(parse(body) or ("?", "?")))
                if rng.random() < 0.3:
                    await asyncio.sleep(0.003)
        out("READY")

        async def produce(p: int) -> None:
            await produce_forever(q.put, p, out, rng)

        await asyncio.gather(*(produce(p) for p in range(PRODUCERS)))


# ---------------------------------------------------------------------- broker

BROKER_TOPICS = {0: "t", 1: "t", 2: "u"}  # producer -> topic; "u" has no channel
BROKER_CHANNEL = "c"


def broker_options(kind: str) -> dict[str, object]:
    """The ``BrokerOptions`` of the ``broker`` (``sync_every=1``) and ``brokerdefault``
    workloads: small segments and ack-log segments, so files roll."""
    opts: dict[str, object] = {"max_bytes_per_file": 4096}
    if kind == "broker":
        opts["sync_every"] = 1
    return opts


def broker_server(kind: str, directory: str) -> None:
    """The broker process: ``BrokerServer`` on ``directory`` until killed; prints
    ``LISTENING tcp=PORT`` once it listens."""
    from aiodiskqueue.broker import BrokerOptions, BrokerServer

    async def serve() -> None:
        opts = BrokerOptions(**broker_options(kind))  # type: ignore[arg-type]
        async with BrokerServer(directory, tcp_port=0, http_port=0, options=opts) as server:
            print(f"LISTENING tcp={server.tcp_port}", flush=True)
            await asyncio.Event().wait()

    asyncio.run(serve())


def broker(kind: str, directory: str, out: Report, rng: random.Random) -> None:
    """Publish over NSQ's TCP protocol to a broker process with its data directory on
    the mount: ``A p n`` once the broker answered ``OK`` to the ``PUB``; a consumer on
    channel ``c`` of topic ``t`` reports ``D p n`` on delivery and ``G p n`` before it
    sends ``FIN`` (60 %); it requeues 20 % (``REQ``) and leaves the rest in flight.
    Topic ``u`` has no channel: its messages stay in the topic's own store."""
    import subprocess

    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), f"{kind}-server",
                               directory, "-", "0"], stdout=subprocess.PIPE, text=True)
    # Imported while the broker starts.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from test_broker_support import RawClient

    assert server.stdout is not None
    line = server.stdout.readline()
    if not line.startswith("LISTENING"):
        raise RuntimeError(f"broker did not start: {line!r}")
    port = int(line.split("tcp=")[1])

    async def run() -> None:
        consumer = await RawClient.connect(port)
        await consumer.sub("t", BROKER_CHANNEL, rdy=50)
        pubs = [await RawClient.connect(port) for _ in BROKER_TOPICS]
        out("READY")

        async def produce(p: int) -> None:
            await produce_forever(lambda body: pubs[p].pub(BROKER_TOPICS[p], body), p, out, rng)

        async def consume() -> None:
            while True:
                f = await consumer.read()
                if not f.is_message:
                    continue
                key = parse(f.body) or ("?", "?")
                out("D", *key)
                r = rng.random()
                if r < 0.6:
                    out("G", *key)  # before FIN: once sent, it may be durably finished
                    consumer.send(b"FIN " + f.msg_id)
                elif r < 0.8:
                    consumer.send(b"REQ " + f.msg_id + b" 0")

        await asyncio.gather(*(produce(p) for p in BROKER_TOPICS), consume())

    asyncio.run(run())


def main() -> None:
    kind, directory, report, seed = sys.argv[1:5]
    if kind.endswith("-server"):
        broker_server(kind.removesuffix("-server"), directory)
        return
    out = Report(report)
    rng = random.Random(int(seed))
    if kind == "repair":
        repair(directory, out, rng)
    elif kind == "spark":
        spark(directory, out, rng)
    elif kind == "procs":
        procs(directory, report, seed, out)
    elif kind == "procs-consumer":
        asyncio.run(procs_role("consumer", directory, out, random.Random(int(seed) + 1)))
    elif kind in ("broker", "brokerdefault"):
        broker(kind, directory, out, rng)
    elif kind in ("ack", "ackdefault"):
        asyncio.run(ackqueue(kind, directory, out, rng))
    else:
        asyncio.run(diskqueue(kind, directory, out, rng))


if __name__ == "__main__":
    main()

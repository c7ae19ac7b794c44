"""Child process for the AckQueue kill tests; killed with SIGKILL at random points.

``consume DIR SYNC_EVERY SEED [LOG_SEGMENT_BYTES DATA_FILE_BYTES]``: four
consumer tasks (two take with ``async for``, two with ``get_many(3)``); each prints
``B idx id attempts`` just before ``finish()`` and ``F idx`` once it returned, or
``R idx id attempts`` before a requeue.
``defer DIR N``: puts deferred messages, printing ``P idx t delay`` (t: wall
clock ns before the call) once ``put()`` returned.
Both print ``READY`` once the queue is open. One line per write, flushed.
``linger DIR``: with ``LINGER`` a minute, puts m0..m3, commits, takes m0 and m1,
finishes m0, commits again (the records of both still linger), prints ``COMMITTED``
and waits to be killed.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time

from aiodiskqueue import AckQueue, Message, QueueClosed
from aiodiskqueue.ack import pump


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def consume(directory: str, sync_every: int, seed: int, log_bytes: int,
                  data_bytes: int) -> None:
    rng = random.Random(seed)
    async with AckQueue(directory, "jobs", sync_every=sync_every, msg_timeout=60.0,
                        max_in_flight=8, log_segment_bytes=log_bytes,
                        max_bytes_per_file=data_bytes) as q:
        out("READY")

        async def handle(msg: Message) -> None:
            idx = msg.body.decode()
            if rng.random() < 0.1:
                out(f"R {idx} {msg.id} {msg.attempts}")
                # Now or a little later: requeued entries reach the log with their bodies.
                await msg.requeue(rng.choice([0.0, 0.05]))
                return
            out(f"B {idx} {msg.id} {msg.attempts}")
            await msg.finish()
            out(f"F {idx}")

        async def worker() -> None:
            async for msg in q:
                await handle(msg)

        async def batch_worker() -> None:  # deliveries of a batch: get_many's path
            while True:
                try:
                    batch = await q.get_many(3)
                except QueueClosed:
                    return
                for msg in batch:
                    await handle(msg)

        await asyncio.gather(worker(), worker(), batch_worker(), batch_worker())


async def defer(directory: str, n: int) -> None:
    async with AckQueue(directory, "jobs") as q:
        out("READY")
        for i in range(n):
            delay = 100.0 + i % 50
            t = time.time_ns()
            await q.put(b"%d" % i, delay=delay)
            out(f"P {i} {t} {delay}")


async def linger(directory: str) -> None:
    pump.LINGER = 60.0
    async with AckQueue(directory, "jobs", sync_interval=600.0) as q:
        await q.put_many([b"m0", b"m1", b"m2", b"m3"])
        await q.sync()
        m0, m1 = await q.get(), await q.get()
        assert (m0.body, m1.body) == (b"m0", b"m1")
        await m0.finish()
        await q.sync()
        out("COMMITTED")
        await asyncio.sleep(600)


if __name__ == "__main__":
    mode, directory, *rest = sys.argv[1:]
    if mode == "consume":
        sizes = [int(x) for x in rest[2:4]] or [8 * 2**20, 100 * 2**20]
        asyncio.run(consume(directory, int(rest[0]), int(rest[1]), *sizes))
    elif mode == "linger":
        asyncio.run(linger(directory))
    else:
        asyncio.run(defer(directory, int(rest[0])))

"""Reliable workers on an AckQueue: finish on success, retry with backoff, dead letters.

Run: ``python examples/ack_worker.py [DIRECTORY]`` (a temporary directory by
default). Puts ten jobs, one of which always fails, and one job deferred by a
second; three workers process them with ``async with msg``. The failing job is
retried after 1 s and 2 s; after its third attempt it goes to the dead-letter
queue ``jobs.dead``.
Kill it at any moment and run it again on the same directory: unfinished jobs
come back.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile

from aiodiskqueue import AckQueue, Message


async def handle(msg: Message) -> None:
    if msg.body == b"poison":
        raise ValueError("cannot process this job")
    await asyncio.sleep(0.01)  # the work


async def worker(q: AckQueue, n: int) -> None:
    async for msg in q:
        try:
            async with msg:  # finish on success; requeue with backoff, then re-raise, on an error
                await handle(msg)
        except Exception as exc:  # noqa: BLE001 - requeued and logged: go on with the next one
            print(f"worker {n}: {msg.body.decode()} failed ({exc}); requeued")
            continue
        print(f"worker {n}: done {msg.body.decode()} (id {msg.id}, attempt {msg.attempts})")


async def main(directory: str) -> None:
    async with AckQueue(directory, "jobs", msg_timeout=10.0, max_attempts=3) as q:
        if q.empty():
            for i in range(9):
                await q.put(b"job-%d" % i)
            await q.put(b"poison")
            await q.put(b"later", delay=1.0)
        workers = [asyncio.create_task(worker(q, n)) for n in range(3)]
        dead = await q.dead_letters.get()  # the poison job, after 3 attempts
        print(f"dead letter: {dead.decode()}")
        while (st := q.statistics()).depth or st.in_flight or st.deferred:
            await asyncio.sleep(0.1)  # ready, in flight or deferred work remains
        st = q.statistics()
        print(f"finished {st.finished}, requeued {st.requeued}, dead-lettered "
              f"{st.dead_lettered}, in flight {st.in_flight}")
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()))

"""Child process for the queue group kill tests; run as ``python group_child.py MODE ...``.

Each prints one line per event, flushed, so the parent can read as it goes:

* ``produce DIR NAME START``: open a group producer, print ``READY shard``, then put
  ``b"shard:i"`` for i = START, START+1, ... forever, printing ``P shard:i`` after each
  ``put()`` returns.
* ``consume DIR NAME SYNC_EVERY [ack]``: open a group consumer (its shards store their
  read positions every SYNC_EVERY gets), print ``READY``, then ``G shard:i`` after each
  get. With ``ack``: an AckQueueGroup (``sync_every=1``), and ``F shard:i`` after each
  ``finish()`` returned (durable).
* ``drain DIR NAME [ack]``: as ``consume``, until nothing came for a while and the
  consumer holds every shard with nothing left; then close and print ``DONE``.
"""

from __future__ import annotations

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from aiodiskqueue import AckQueueGroup, QueueGroup
from aiodiskqueue.group.layout import group_layout


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def produce(directory: str, name: str, start: int) -> None:
    async with QueueGroup(directory, name, "producer") as g:
        shard = g.shard
        assert shard is not None
        out(f"READY {shard}")
        i = start
        while True:
            msg = f"{shard}:{i}"
            await g.put(msg.encode())
            out(f"P {msg}")
            i += 1
            await asyncio.sleep(0.001)


async def consume(directory: str, name: str, sync_every: int) -> None:
    async with QueueGroup(directory, name, "consumer", sync_every=sync_every) as g:
        out("READY")
        async for m in g:
            out(f"G {m.decode()}")


async def ack_consume(directory: str, name: str) -> None:
    async with AckQueueGroup(directory, name, "consumer", sync_every=1) as g:
        out("READY")
        async for m in g:
            out(f"G {m.body.decode()}")
            await m.finish()
            out(f"F {m.body.decode()}")


async def drain(directory: str, name: str, ack: bool) -> None:
    lay = group_layout(directory, name)
    if ack:
        ag = AckQueueGroup(directory, name, "consumer", sync_every=1)

        async def one() -> None:
            m = await asyncio.wait_for(ag.get(), 2.0)
            out(f"G {m.body.decode()}")
            await m.finish()
            out(f"F {m.body.decode()}")

        g: QueueGroup | AckQueueGroup = ag
    else:
        qg = QueueGroup(directory, name, "consumer", sync_every=100)

        async def one() -> None:
            out(f"G {(await asyncio.wait_for(qg.get(), 2.0)).decode()}")

        g = qg
    async with g:
        out("READY")
        while True:
            try:
                await one()
            except TimeoutError:
                if g.qsize() == 0 and len(g.shards) == len(lay.shards()):
                    break
    out("DONE")


def main() -> None:
    mode, directory, name, *rest = sys.argv[1:]
    if mode == "produce":
        asyncio.run(produce(directory, name, int(rest[0])))
    elif mode == "consume" and rest[1:] == ["ack"]:
        asyncio.run(ack_consume(directory, name))
    elif mode == "consume":
        asyncio.run(consume(directory, name, int(rest[0])))
    elif mode == "drain":
        asyncio.run(drain(directory, name, rest == ["ack"]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()

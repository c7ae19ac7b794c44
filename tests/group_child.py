"""Child process for the queue group kill tests; run as ``python group_child.py MODE ...``.

Each prints one line per event, flushed, so the parent can read as it goes:

* ``produce DIR NAME START``: open a group producer, print ``READY shard``, then put
  ``b"shard:i"`` for i = START, START+1, ... forever, printing ``P shard:i`` after each
  ``put()`` returns.
* ``consume DIR NAME SYNC_EVERY``: open a group consumer (its shards store their read
  positions every SYNC_EVERY gets), print ``READY``, then ``G shard:i`` after each get.
* ``drain DIR NAME``: as ``consume``, until nothing came for a while and the consumer
  holds every shard with nothing left; then close and print ``DONE``.
"""

from __future__ import annotations

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from aiodiskqueue import QueueGroup
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


async def drain(directory: str, name: str) -> None:
    lay = group_layout(directory, name)
    async with QueueGroup(directory, name, "consumer", sync_every=100) as g:
        out("READY")
        while True:
            try:
                m = await asyncio.wait_for(g.get(), 2.0)
            except TimeoutError:
                if g.qsize() == 0 and len(g.shards) == len(lay.shards()):
                    break
                continue
            out(f"G {m.decode()}")
    out("DONE")


def main() -> None:
    mode, directory, name, *rest = sys.argv[1:]
    if mode == "produce":
        asyncio.run(produce(directory, name, int(rest[0])))
    elif mode == "consume":
        asyncio.run(consume(directory, name, int(rest[0])))
    elif mode == "drain":
        asyncio.run(drain(directory, name))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()

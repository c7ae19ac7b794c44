"""Child process for the kill and lock tests; run as ``python helpers_child.py MODE ...``.

Modes (each prints one line per event, flushed, so the parent can read as it goes):

* ``produce DIR NAME START SYNC_EVERY MAX_BYTES WORKERS``: print ``READY n`` once
  open (n: records recovered past the meta's write position), then WORKERS
  concurrent tasks put ``child_msg(START + w*STRIDE + k)`` for k = 0, 1, ...
  forever, each printing the index after its ``put()`` returns.
* ``consume DIR NAME SYNC_EVERY_GETS``: get forever; print ``G i`` after each
  ``get()`` returns (i parsed from the message) and ``S i`` after each explicit
  ``sync()`` that followed the get of ``i``.
* ``hold DIR NAME``: open the queue, print ``OPEN pid``, wait for stdin to close,
  close the queue.
* ``try DIR NAME``: try to open the queue; print ``LOCKED pid`` or ``OPENED``.
* ``rproduce DIR NAME START SYNC_EVERY MAX_BYTES``: as ``produce`` with one worker, as
  ``role="producer"``.
* ``rconsume DIR NAME SYNC_EVERY MAX_BYTES``: as ``role="consumer"``, the meta stored by
  the count of gets (``sync_every``); print ``READY``, then ``G i`` after each get.
* ``rhold DIR NAME ROLE``, ``rtry DIR NAME ROLE``: ``hold`` and ``try`` with a role.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from aiodiskqueue import DiskQueue, QueueLocked

STRIDE = 10**5  # index distance between the streams of concurrent producer workers


def child_msg(i: int) -> bytes:
    """Message ``i``: its index, then 0..199 bytes of padding derived from it."""
    return b"%010d:" % i + bytes([i & 0xFF]) * (i * 7 % 200)


def msg_index(m: bytes) -> int:
    """The index of a message made by :func:`child_msg`; raises ValueError if malformed."""
    i = int(m[:10])
    if m != child_msg(i):
        raise ValueError(f"message {i} is damaged: {m!r}")
    return i


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def produce(directory: str, name: str, start: int, sync_every: int, max_bytes: int,
                  workers: int) -> None:
    async with DiskQueue(directory, name, sync_every=sync_every,
                         max_bytes_per_file=max_bytes) as q:
        _say(f"READY {q.statistics().recovered}")

        async def worker(first: int) -> None:
            i = first
            while True:
                await q.put(child_msg(i))
                _say(str(i))
                i += 1

        await asyncio.gather(*(worker(start + w * STRIDE) for w in range(workers)))


async def consume(directory: str, name: str, every: int) -> None:
    # Meta is stored only by the explicit sync() below: no count or timer syncs.
    async with DiskQueue(directory, name, sync_every=10**9, sync_interval=3600.0) as q:
        _say("READY")
        n = 0
        while True:
            i = msg_index(await q.get())
            _say(f"G {i}")
            n += 1
            if n % every == 0:
                await q.sync()
                _say(f"S {i}")


async def drain(directory: str, name: str, sync_every: int) -> None:
    # The meta is stored by the count of gets alone (the consumer's rounds, which run on
    # the native meta thread once a store took the native path); ``M`` once they do.
    async with DiskQueue(directory, name, sync_every=sync_every, sync_interval=3600.0,
                         max_bytes_per_file=8192, read_buffer_bytes=4096) as q:
        _say("READY")
        native = False
        async for m in q:
            _say(f"G {msg_index(m)}")
            if not native and q._e.meta_lane is not None:
                native = True
                _say("M")


async def rproduce(directory: str, name: str, start: int, sync_every: int,
                   max_bytes: int) -> None:
    async with DiskQueue(directory, name, "producer", sync_every=sync_every,
                         max_bytes_per_file=max_bytes) as q:
        _say(f"READY {q.statistics().recovered}")
        i = start
        while True:
            await q.put(child_msg(i))
            _say(str(i))
            i += 1


async def rconsume(directory: str, name: str, sync_every: int, max_bytes: int) -> None:
    async with DiskQueue(directory, name, "consumer", sync_every=sync_every,
                         sync_interval=3600.0, max_bytes_per_file=max_bytes) as q:
        _say("READY")
        async for m in q:
            _say(f"G {msg_index(m)}")


async def idle(directory: str, name: str, seconds: float) -> None:
    """Wait in get() as a consumer; say the CPU this process spent idle, then what came."""
    async with DiskQueue(directory, name, "consumer") as q:
        waiter = asyncio.ensure_future(q.get())
        await asyncio.sleep(0.2)
        before = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(seconds)
        after = resource.getrusage(resource.RUSAGE_SELF)
        used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        _say(f"IDLE {used:.6f}")
        _say(f"G {(await waiter).decode()}")


async def hold(directory: str, name: str, role: str = "both") -> None:
    async with DiskQueue(directory, name, role):
        _say(f"OPEN {os.getpid()}")
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def try_open(directory: str, name: str, role: str = "both") -> None:
    try:
        q = await DiskQueue.open(directory, name, role=role)
    except QueueLocked as exc:
        _say(f"LOCKED {exc.pid}")
        return
    await q.aclose()
    _say("OPENED")


def main(argv: list[str]) -> None:
    """Dispatch on the mode in ``argv[1]``."""
    mode, args = argv[1], argv[2:]
    if mode == "produce":
        asyncio.run(produce(args[0], args[1], int(args[2]), int(args[3]), int(args[4]),
                            int(args[5])))
    elif mode == "consume":
        asyncio.run(consume(args[0], args[1], int(args[2])))
    elif mode == "drain":
        asyncio.run(drain(args[0], args[1], int(args[2])))
    elif mode == "hold":
        asyncio.run(hold(args[0], args[1]))
    elif mode == "try":
        asyncio.run(try_open(args[0], args[1]))
    elif mode == "rproduce":
        asyncio.run(rproduce(args[0], args[1], int(args[2]), int(args[3]), int(args[4])))
    elif mode == "rconsume":
        asyncio.run(rconsume(args[0], args[1], int(args[2]), int(args[3])))
    elif mode == "rhold":
        asyncio.run(hold(args[0], args[1], args[2]))
    elif mode == "ridle":
        asyncio.run(idle(args[0], args[1], float(args[2])))
    elif mode == "rtry":
        asyncio.run(try_open(args[0], args[1], args[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)

"""SIGKILL the broker (a real child process) and restart it: no unfinished message is lost.

nsqd keeps in-flight and deferred messages in memory and loses them on a
crash; this broker's channels are AckQueues, so they come back.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_broker_support import TIMEOUT, RawClient, raw_clients, start_broker_process

__all__ = ["raw_clients"]

pytestmark = pytest.mark.slow


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Broker processes started by a test; killed at the end whatever happens."""
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


def _start(data: Path, procs: list[subprocess.Popen[str]], *extra: str) -> tuple[int, int]:
    proc, tcp, http = start_broker_process(data, *extra)
    procs.append(proc)
    return tcp, http


def _kill(procs: list[subprocess.Popen[str]]) -> None:
    p = procs[-1]
    p.send_signal(signal.SIGKILL)
    p.wait()


async def _client(port: int, clients: list[RawClient]) -> RawClient:
    c = await RawClient.connect(port)
    clients.append(c)
    return c


async def _barrier(c: RawClient) -> None:
    """Commands on one connection run in order: once this PUB is answered, earlier FINs ran.

    Messages that arrive meanwhile are left in flight.
    """
    c.send(b"PUB barrier", b"x")
    while True:
        f = await c.read()
        if not f.is_message:
            assert (f.is_response, f.data) == (True, b"OK"), f
            return


async def _drain(
    port: int, clients: list[RawClient], topic: str, want: set[bytes]
) -> list[bytes]:
    """Consume from ``topic``/``c`` until every body of ``want`` was seen; FIN all;
    return all seen."""
    c = await _client(port, clients)
    await c.sub(topic, "c", rdy=100)
    seen: list[bytes] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while not want <= set(seen):
        assert loop.time() < deadline, f"missing after restart: {sorted(want - set(seen))[:10]}"
        m = await c.read()
        assert m.is_message, m
        seen.append(m.body)
        c.send(b"FIN " + m.msg_id)
    await _barrier(c)
    return seen


@pytest.mark.parametrize("sync_every", ["2500", "1"], ids=["default-sync", "sync-every-1"])
async def test_kill_keeps_queued_in_flight_deferred_and_topic_messages(
    tmp_path: Path, procs: list[subprocess.Popen[str]], raw_clients: list[RawClient],
    sync_every: str,
) -> None:
    data = tmp_path / "data"
    tcp, _ = _start(data, procs, "--sync-every", sync_every)

    consumer = await _client(tcp, raw_clients)
    await consumer.sub("k", "c", rdy=0)
    pub = await _client(tcp, raw_clients)
    bodies = [b"m%03d" % i for i in range(100)]
    for b in bodies:
        await pub.pub("k", b)
    pub.send(b"DPUB k 400", b"deferred-publish")
    await pub.expect_ok()
    for i in range(5):  # a topic with no channel keeps its messages too
        await pub.pub("k2", b"t%d" % i)

    consumer.send(b"RDY 40")
    got = [await consumer.read() for _ in range(40)]
    finished = {m.body for m in got[:20]}
    for m in got[:20]:
        consumer.send(b"FIN " + m.msg_id)
    for m in got[20:30]:  # requeued with a delay: deferred at the moment of the kill
        consumer.send(b"REQ " + m.msg_id + b" 300")
    # got[30:40] stay in flight.
    await _barrier(consumer)

    _kill(procs)
    tcp2, _ = _start(data, procs, "--sync-every", sync_every)

    unfinished = set(bodies) - finished | {b"deferred-publish"}
    seen = await _drain(tcp2, raw_clients, "k", unfinished)
    assert unfinished <= set(seen)
    if sync_every == "1":
        # Every FIN returned only once durable: finished messages never come back.
        assert not finished & set(seen)
    assert set(await _drain(tcp2, raw_clients, "k2", {b"t%d" % i for i in range(5)})) == {
        b"t%d" % i for i in range(5)}


async def test_kill_at_random_moments_under_load(
    tmp_path: Path, procs: list[subprocess.Popen[str]], raw_clients: list[RawClient]
) -> None:
    data = tmp_path / "data"
    rng = random.Random(7)
    sent: set[bytes] = set()
    acked: set[bytes] = set()
    finished: set[bytes] = set()
    seq = 0
    for _round in range(3):
        tcp, _ = _start(data, procs)
        consumer = await _client(tcp, raw_clients)
        await consumer.sub("load", "c", rdy=20)
        pubs = [await _client(tcp, raw_clients) for _ in range(4)]
        stop_at = len(acked) + rng.randrange(50, 300)

        async def publish(c: RawClient, stop_at: int) -> None:
            nonlocal seq
            while len(acked) < stop_at:
                seq += 1
                body = b"p%06d" % seq
                sent.add(body)
                await c.pub("load", body)
                acked.add(body)

        async def consume(consumer: RawClient, stop_at: int) -> None:
            while len(acked) < stop_at:
                m = await consumer.read()
                if rng.random() < 0.5:
                    consumer.send(b"FIN " + m.msg_id)
                    finished.add(m.body)

        consume_task = asyncio.ensure_future(consume(consumer, stop_at))
        await asyncio.gather(*(publish(c, stop_at) for c in pubs))
        # Kill mid-stream: FINs just sent may or may not have landed (at-least-once).
        _kill(procs)
        consume_task.cancel()
        try:
            await consume_task
        except (asyncio.CancelledError, asyncio.IncompleteReadError, ConnectionError):
            pass
        for c in raw_clients:
            await c.close()
        raw_clients.clear()

    tcp, _ = _start(data, procs)
    seen = await _drain(tcp, raw_clients, "load", acked - finished)
    assert acked - finished <= set(seen)
    assert set(seen) <= sent  # nothing that was never published


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_command_line_broker_serves_and_stops_on_sigterm(
    tmp_path: Path, procs: list[subprocess.Popen[str]], raw_clients: list[RawClient], loop: str
) -> None:
    tcp, _ = _start(tmp_path / "data", procs, *(["--uvloop"] if loop == "uvloop" else []))
    c = await _client(tcp, raw_clients)
    await c.sub("cli", "c")
    # Publish on a second connection: on the subscriber's own connection the MESSAGE
    # frame may arrive before the PUB's OK (nsqd gives no order between the two either).
    p = await _client(tcp, raw_clients)
    await p.pub("cli", b"hello")
    m = await c.read()
    assert m.body == b"hello"
    c.send(b"FIN " + m.msg_id)
    await _barrier(c)
    procs[-1].send_signal(signal.SIGTERM)
    assert procs[-1].wait(timeout=TIMEOUT) == 0  # a clean shutdown

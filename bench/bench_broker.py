"""End-to-end messages/s through the NSQ-protocol broker, against the queue library alone.

Every row moves the same workload: ``--messages`` bodies of ``--size`` bytes
from ``--publishers`` concurrent producers to ``--consumers`` concurrent
consumers that finish each message; the clock runs from the first publish to
the last message received (and FIN sent). Rows:

``library``          the same producers and consumers as asyncio tasks on an
                     in-process :class:`~aiodiskqueue.AckQueue` (nsq format):
                     ``await put()``, ``await get()`` + ``await finish()``.
                     The anchor: what the broker adds is the network and the
                     protocol.
``broker raw``       the broker as a child process; minimal protocol V2
                     clients over loopback: each publisher awaits ``OK``
                     before the next ``PUB`` (as ansq and pynsq do), each
                     consumer has ``RDY --rdy`` and sends ``FIN`` at once.
``broker raw x64``   the same, publishers keep 64 ``PUB`` in flight.
``broker ansq``      ansq (PyPI) publishers and consumers.
``broker ansq mpub`` ansq publishers sending ``MPUB`` of 100.

Then the broker's own CPU cost per message, with pynsq (the tornado client)
in a child process, each phase on its own (``--cpu-messages``, 50,000 by
default, of ``--size`` bytes):

``pynsq PUB``        one Writer, ``PUB`` with up to ``--window`` unanswered.
``pynsq MPUB x100``  one Writer, ``MPUB`` of 100.
``pynsq consume``    one Reader, ``max_in_flight`` 200, FIN for each, over the
                     messages the two publish phases stored.

With ``--secure`` the three pynsq rows run again on the same broker (started
with a throwaway certificate made by the ``openssl`` command) with pynsq's
connections upgraded in IDENTIFY: ``... tls``, ``... deflate``, ``... snappy``
(pynsq needs python-snappy), after the plain rows, so that the figures sit
side by side from one run.

With ``--null-store`` the three pynsq rows run again (``... null``) against a
broker whose topics and channels keep only a count in memory
(``bench/null_store_broker.py``): no queue, no files, no I/O thread. What the
broker costs per message there is its protocol, event loop and sockets. It is
not a strict lower bound: the CPU per message also follows how many commands
arrive per wake-up, which the store's speed changes. These rows run after the
others, on a fresh broker.

The CPU column is the broker process's utime + stime from
``/proc/PID/stat`` (all its threads) over the phase, per message; the
library row's is this process's CPU. Wall-clock rows also show the broker's
CPU per message.

    python bench/bench_broker.py --messages 20000 --publishers 4 --consumers 4 [--uvloop]
    python bench/bench_broker.py --only-cpu        # just the pynsq CPU rows

The broker and the clients share the machine's cores: the figures are
end-to-end system throughput on one host, not the broker's ceiling.

The last line is a calibration measured in the same run, before and after
the rows: the CPU cost of an ``asyncio.Queue`` round trip between two tasks,
against the range measured for it on the reference machine of this class (the
machine the speed targets were set on), so that a reader
can tell how fast the (shared) machine ran. It is printed, not applied. A second
line gives the CPU of a round trip to a thread that sleeps between jobs (two thread
wake-ups), and every row its process's thread sleeps per message: on a machine
where a wake-up is dear, they tell how much of a row's CPU is hand-overs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import select
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

from aiohttp import ClientSession

import aiodiskqueue
from aiodiskqueue import AckQueue
from aiodiskqueue._core.iothread import IOThread

#: The directory holding the ``aiodiskqueue`` package this process runs.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(aiodiskqueue.__file__)))
NULL_STORE_BROKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                 "null_store_broker.py")

# name, seconds, messages/s, CPU us per message, thread sleeps (voluntary context switches)
# per message
Row = tuple[str, float, float, float, float]

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads) in seconds, from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / _TICK


def process_sleeps(pid: int) -> int:
    """Voluntary context switches of process ``pid``'s live threads, summed: how often
    one of them blocked (in a futex, epoll, a queue) and was woken again."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status", "rb") as f:
                status = f.read()
        except OSError:  # the thread has just ended
            continue
        for line in status.splitlines():
            if line.startswith(b"voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def self_cpu() -> float:
    """This process's user + system CPU seconds."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def self_sleeps() -> int:
    """Voluntary context switches of this process, all its threads (ended ones too)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


# ---------------------------------------------------------------------- calibration

CALIBRATION_ROUND_TRIPS = 20_000
CALIBRATION_THEN = (150_000, 200_000)
"""Round trips/s of the same workload on the reference machine (``await`` round
trip between two tasks via ``asyncio.Queue``), the machine class the targets refer to."""


async def calibration() -> float:
    """CPU microseconds per ``asyncio.Queue`` round trip between two tasks, in this process.

    A fixed pure-Python/asyncio workload, to scale the figures of a run to the
    machine's speed at the time; it is printed, never applied to the figures.
    """
    ping: asyncio.Queue[int] = asyncio.Queue()
    pong: asyncio.Queue[int] = asyncio.Queue()

    async def echo() -> None:
        while (i := await ping.get()) >= 0:
            pong.put_nowait(i)

    task = asyncio.ensure_future(echo())
    c0 = self_cpu()
    for i in range(CALIBRATION_ROUND_TRIPS):
        ping.put_nowait(i)
        await pong.get()
    cpu = self_cpu() - c0
    ping.put_nowait(-1)
    await task
    return cpu / CALIBRATION_ROUND_TRIPS * 1e6


HOP_ROUND_TRIPS = 2_000


async def hop_calibration() -> float:
    """CPU microseconds per round trip to a thread that sleeps between jobs (the queue's
    I/O thread, :class:`~aiodiskqueue._core.iothread.IOThread`): two thread wake-ups.

    Where a thread's sleep and wake-up are expensive (a VM whose idle vCPUs halt), this
    is many times the ``asyncio.Queue`` round trip, and every path that hands work to a
    thread pays it: the rows' sleeps per message say how often.
    """
    io = IOThread("bench-hop")
    try:
        for _ in range(100):
            await io.run(int)
        c0 = self_cpu()
        for _ in range(HOP_ROUND_TRIPS):
            await io.run(int)
        return (self_cpu() - c0) / HOP_ROUND_TRIPS * 1e6
    finally:
        io.stop()


def hop_line(us: list[float]) -> str:
    """The thread hop calibration as printed."""
    return (f"thread hop: {min(us):.1f} us CPU per round trip to a thread that sleeps between "
            f"jobs (runs {', '.join(f'{u:.1f}' for u in us)} us), against the "
            f"asyncio.Queue round trip above: what a row pays for each of its sleeps.")


def calibration_line(us: list[float]) -> str:
    """The calibration as printed: the run's figure against the machine figures' range."""
    best = min(us)
    lo, hi = (1e6 / r for r in CALIBRATION_THEN[::-1])
    return (f"calibration: asyncio.Queue round trip {best:.1f} us CPU "
            f"({1e6 / best / 1000:.0f} k/s; runs {', '.join(f'{u:.1f}' for u in us)} us); "
            f"reference machine: {CALIBRATION_THEN[0] // 1000}-{CALIBRATION_THEN[1] // 1000} k/s "
            f"({lo:.1f}-{hi:.1f} us). This machine now runs {best / hi:.1f}-{best / lo:.1f}x "
            f"slower than then: divide the CPU figures by that to compare with targets "
            f"set on the machine as measured then (not applied to the table).")


# ---------------------------------------------------------------------- library anchor

async def run_library(n: int, size: int, pubs: int, cons: int, sync_every: int
                      ) -> tuple[float, float, int]:
    """Producers and consumers as tasks on one AckQueue; return seconds, CPU seconds and
    thread sleeps."""
    body = b"x" * size
    with tempfile.TemporaryDirectory() as d:
        async with AckQueue(d, "t:c", format="nsq", max_in_flight=1 << 30,
                            sync_every=sync_every) as q:
            done = asyncio.Event()
            received = 0

            async def produce(k: int) -> None:
                for _ in range(k):
                    await q.put(body)

            async def consume() -> None:
                nonlocal received
                while received < n:
                    m = await q.get()
                    received += 1
                    await m.finish()
                    if received >= n:
                        done.set()

            t0, c0, s0 = time.perf_counter(), self_cpu(), self_sleeps()
            consumers = [asyncio.ensure_future(consume()) for _ in range(cons)]
            await asyncio.gather(*(produce(k) for k in _split(n, pubs)))
            await done.wait()
            elapsed, cpu = time.perf_counter() - t0, self_cpu() - c0
            sleeps = self_sleeps() - s0
            for c in consumers:
                c.cancel()
            await asyncio.gather(*consumers, return_exceptions=True)
            return elapsed, cpu, sleeps


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


# ---------------------------------------------------------------------- broker process

class BrokerProcess:
    """``python -m aiodiskqueue.broker`` on ephemeral ports in a temporary directory."""

    def __init__(self, sync_every: int, *extra: str, null_store: bool = False) -> None:
        self.dir = tempfile.TemporaryDirectory()
        # null_store: the broker with no queue behind it (bench/null_store_broker.py).
        main = [NULL_STORE_BROKER] if null_store else ["-m", "aiodiskqueue.broker"]
        # The broker runs the package this process imported (a worktree on PYTHONPATH, to
        # compare two versions): `-m` would put the working directory first on the
        # child's path, so it starts in the data directory, with the package's root first.
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, *main, "--data-dir", self.dir.name,
             "--tcp-port", "0", "--http-port", "0", "--sync-every", str(sync_every), *extra],
            stdout=subprocess.PIPE, text=True, cwd=self.dir.name, env=env,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("LISTENING"):
            self.close()
            raise RuntimeError(f"broker did not start: {line!r}")
        fields = dict(kv.split("=") for kv in line.split()[1:])
        self.tcp, self.http = int(fields["tcp"]), int(fields["http"])

    async def finished(self, topic: str) -> int:
        url = f"http://127.0.0.1:{self.http}/stats?format=json&topic={topic}"
        async with ClientSession() as s, s.get(url) as r:
            data = await r.json()
        return sum(c["finish_count"] for t in data["topics"] for c in t["channels"])

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.dir.cleanup()


# ---------------------------------------------------------------------- raw protocol clients

async def _raw_connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"  V2")
    return r, w


async def _read_frame(r: asyncio.StreamReader) -> tuple[int, bytes]:
    size, ftype = struct.unpack(">ii", await r.readexactly(8))
    return ftype, await r.readexactly(size - 4)


async def raw_publisher(port: int, topic: str, k: int, body: bytes, window: int) -> None:
    """Publish ``k`` messages keeping up to ``window`` PUBs unanswered."""
    r, w = await _raw_connect(port)
    cmd = b"PUB " + topic.encode() + b"\n" + struct.pack(">i", len(body)) + body
    outstanding = 0
    sent = 0
    while sent < k or outstanding:
        while sent < k and outstanding < window:
            w.write(cmd)
            sent += 1
            outstanding += 1
        ftype, data = await _read_frame(r)
        if ftype == 0 and data == b"_heartbeat_":
            w.write(b"NOP\n")
            continue
        if data != b"OK":
            raise RuntimeError(f"PUB failed: {data!r}")
        outstanding -= 1
    w.close()


async def raw_consumer(port: int, topic: str, rdy: int, counter: list[int], n: int,
                       done: asyncio.Event) -> None:
    """Consume and FIN until ``counter[0]`` reaches ``n``."""
    r, w = await _raw_connect(port)
    w.write(f"SUB {topic} ch\nRDY {rdy}\n".encode())
    ftype, data = await _read_frame(r)
    assert data == b"OK", data
    try:
        while counter[0] < n:
            ftype, data = await _read_frame(r)
            if ftype == 2:
                w.write(b"FIN " + data[10:26] + b"\n")
                counter[0] += 1
                if counter[0] >= n:
                    done.set()
            elif data == b"_heartbeat_":
                w.write(b"NOP\n")
    finally:
        w.close()


# ---------------------------------------------------------------------- ansq clients

async def ansq_publisher(port: int, topic: str, k: int, body: bytes, batch: int) -> None:
    """Publish ``k`` messages with ansq, one PUB (or one MPUB of ``batch``) at a time."""
    from ansq import ConnectionOptions, open_connection

    c = await open_connection("127.0.0.1", port,
                              connection_options=ConnectionOptions(auto_reconnect=False))
    try:
        left = k
        while left:
            m = min(batch, left)
            resp = await (c.pub(topic, body) if m == 1 else c.mpub(topic, *([body] * m)))
            if resp is None or not resp.is_ok:
                raise RuntimeError(f"publish failed: {resp!r}")
            left -= m
    finally:
        await c.close()


async def ansq_consumer(port: int, topic: str, rdy: int, counter: list[int], n: int,
                        done: asyncio.Event) -> None:
    """Consume and FIN with ansq until ``counter[0]`` reaches ``n``."""
    from ansq import ConnectionOptions, open_connection

    c = await open_connection("127.0.0.1", port,
                              connection_options=ConnectionOptions(auto_reconnect=False))
    try:
        await c.subscribe(topic, "ch", rdy)
        while counter[0] < n:
            m = await c.wait_for_message()
            if m is None:
                return
            await m.fin()
            counter[0] += 1
            if counter[0] >= n:
                done.set()
    finally:
        await c.close()


# ---------------------------------------------------------------------- pynsq clients (CPU rows)

PYNSQ = r'''
import json, os, ssl, sys, time
import nsq
import tornado.ioloop

mode, port, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3]
n, size, arg = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
conn_opts = json.loads(os.environ.get("NSQ_CONN_OPTS", "{}"))  # tls_v1, deflate, snappy
if "tls_options" in conn_opts:
    conn_opts["tls_options"]["cert_reqs"] = ssl.CERT_REQUIRED
loop = tornado.ioloop.IOLoop.current()
body = b"x" * size
state = {"sent": 0, "done": 0, "errors": 0, "t0": 0.0}

def stop():
    print(json.dumps({"seconds": time.perf_counter() - state["t0"], "done": state["done"],
                      "errors": state["errors"]}), flush=True)
    loop.stop()

if mode in ("pub", "mpub"):
    w = nsq.Writer(["127.0.0.1:%d" % port], **conn_opts)
    batch = arg if mode == "mpub" else 1

    def send():
        m = min(batch, n - state["sent"])
        state["sent"] += m
        if m == 1:
            w.pub(topic, body, callback=lambda c, d: done(c, d, 1))
        else:
            w.mpub(topic, [body] * m, callback=lambda c, d: done(c, d, m))

    def done(conn, data, m):
        if isinstance(data, nsq.Error):
            state["errors"] += 1
        state["done"] += m
        if state["done"] >= n:
            stop()
        elif state["sent"] < n:
            send()

    def start():
        if not w.conns:
            loop.call_later(0.01, start)
            return
        state["t0"] = time.perf_counter()
        window = arg if mode == "pub" else 1
        for _ in range(min(window, n)):
            send()

    loop.add_callback(start)
else:
    def handler(msg):
        if state["done"] == 0:
            state["t0"] = time.perf_counter()
        state["done"] += 1
        if state["done"] >= n:
            loop.add_callback(stop)
        return True

    nsq.Reader(topic=topic, channel="ch", message_handler=handler,
               nsqd_tcp_addresses=["127.0.0.1:%d" % port], max_in_flight=arg,
               lookupd_poll_interval=600, **conn_opts)
loop.start()
'''


def make_certificate(directory: str) -> tuple[str, str]:
    """A self-signed P-256 certificate for 127.0.0.1 (the openssl command); its paths."""
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60)
    return cert, key


async def pynsq_phase(broker: BrokerProcess, mode: str, topic: str, n: int, size: int,
                      arg: int, conn_opts: dict[str, object] | None = None
                      ) -> tuple[float, float, int]:
    """Run one pynsq child (pub, mpub or sub); return its seconds, the broker's CPU seconds
    and its threads' sleeps.

    The broker's CPU is read from just before the child starts to just after
    it reports: the child's connect and start-up add a few milliseconds.
    """
    c0, s0 = process_cpu(broker.proc.pid), process_sleeps(broker.proc.pid)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PYNSQ, mode, str(broker.tcp), topic, str(n), str(size), str(arg),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NSQ_CONN_OPTS": json.dumps(conn_opts or {})})
    out, err = await asyncio.wait_for(proc.communicate(), 900)
    cpu = process_cpu(broker.proc.pid) - c0
    sleeps = process_sleeps(broker.proc.pid) - s0
    if proc.returncode != 0:
        raise RuntimeError(f"pynsq {mode} failed: {err.decode()[-2000:]}")
    res = json.loads(out.decode().strip().splitlines()[-1])
    if res["errors"] or res["done"] < n:
        raise RuntimeError(f"pynsq {mode}: {res}")
    return float(res["seconds"]), cpu, sleeps


async def cpu_rows(args: argparse.Namespace, broker: BrokerProcess,
                   add: Callable[[str, int, float, float, int], None], suffix: str = "",
                   conn_opts: dict[str, object] | None = None) -> None:
    """The pynsq rows: PUB, MPUB x100 into one channel, then consume all of them (with
    ``conn_opts``, pynsq's connection options, on a topic of their own)."""
    n, size = args.cpu_messages, args.size
    topic = "cpu" + suffix.replace(" ", "_")
    async with ClientSession() as s:
        for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel=ch"):
            async with s.post(f"http://127.0.0.1:{broker.http}{path}") as r:
                assert r.status == 200, await r.text()
    secs, cpu, sleeps = await pynsq_phase(broker, "pub", topic, n, size, args.window, conn_opts)
    add(f"pynsq PUB (window {args.window}){suffix}", n, secs, cpu, sleeps)
    secs, cpu, sleeps = await pynsq_phase(broker, "mpub", topic, n, size, 100, conn_opts)
    add(f"pynsq MPUB x100{suffix}", n, secs, cpu, sleeps)
    secs, cpu, sleeps = await pynsq_phase(broker, "sub", topic, 2 * n, size, 200, conn_opts)
    add(f"pynsq consume (mif 200){suffix}", 2 * n, secs, cpu, sleeps)


# ---------------------------------------------------------------------- driver

Publisher = Callable[[int, str, int, bytes], Awaitable[None]]
Consumer = Callable[[int, str, int, list[int], int, asyncio.Event], Awaitable[None]]


async def run_broker(broker: BrokerProcess, topic: str, n: int, size: int, pubs: int,
                     cons: int, rdy: int, publisher: Publisher, consumer: Consumer
                     ) -> tuple[float, float, int]:
    """One end-to-end run through the broker; returns seconds, the broker's CPU seconds
    and its threads' sleeps."""
    body = b"x" * size
    counter = [0]
    done = asyncio.Event()
    consumers = [asyncio.ensure_future(consumer(broker.tcp, topic, rdy, counter, n, done))
                 for _ in range(cons)]
    # Let the subscriptions land first so publishing goes straight to the channel.
    while await _clients(broker, topic) < cons:
        failed = [c for c in consumers if c.done()]
        if failed:
            failed[0].result()
            raise RuntimeError("a consumer ended before subscribing")
        await asyncio.sleep(0.01)
    pid = broker.proc.pid
    t0, c0, s0 = time.perf_counter(), process_cpu(pid), process_sleeps(pid)
    await asyncio.gather(*(publisher(broker.tcp, topic, k, body) for k in _split(n, pubs)))
    await asyncio.wait_for(done.wait(), 600)
    elapsed, cpu = time.perf_counter() - t0, process_cpu(pid) - c0
    sleeps = process_sleeps(pid) - s0
    for c in consumers:
        c.cancel()
    await asyncio.gather(*consumers, return_exceptions=True)
    for _ in range(1000):
        if await broker.finished(topic) >= n:
            break
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError("not every message was finished")
    return elapsed, cpu, sleeps


async def _clients(broker: BrokerProcess, topic: str) -> int:
    url = f"http://127.0.0.1:{broker.http}/stats?format=json&topic={topic}"
    async with ClientSession() as s, s.get(url) as r:
        data = await r.json()
    return sum(c["client_count"] for t in data["topics"] for c in t["channels"])


async def main_async(args: argparse.Namespace) -> list[Row]:
    n, size, pubs, cons, rdy = args.messages, args.size, args.publishers, args.consumers, args.rdy
    rows: list[Row] = []
    args.calibration = [await calibration()]
    args.hop = [await hop_calibration()]

    def add(name: str, count: int, secs: float, cpu: float, sleeps: int) -> None:
        rows.append((name, secs, count / secs, cpu / count * 1e6, sleeps / count))
        print(f"{name:30} {count:8d} msgs {secs:8.2f} s {count / secs:10.0f} msg/s "
              f"{cpu / count * 1e6:7.1f} us CPU/msg {sleeps / count:6.3f} sleeps/msg",
              file=sys.stderr)

    secs, cpu, sleeps = await run_library(n, size, pubs, cons, args.sync_every)
    add("library", n, secs, cpu, sleeps)
    secure: list[str] = []
    certs = tempfile.TemporaryDirectory()
    if args.secure:
        cert, key = make_certificate(certs.name)
        secure = ["--tls-cert", cert, "--tls-key", key]
    broker = BrokerProcess(args.sync_every, *(["--uvloop"] if args.uvloop else []), *secure)
    try:
        if not args.only_cpu:
            variants: list[tuple[str, Publisher, Consumer]] = [
                ("broker raw", lambda p, t, k, b: raw_publisher(p, t, k, b, 1), raw_consumer),
                ("broker raw x64", lambda p, t, k, b: raw_publisher(p, t, k, b, 64), raw_consumer),
                ("broker ansq", lambda p, t, k, b: ansq_publisher(p, t, k, b, 1), ansq_consumer),
                ("broker ansq mpub", lambda p, t, k, b: ansq_publisher(p, t, k, b, 100),
                 ansq_consumer),
            ]
            for i, (name, pub, con) in enumerate(variants):
                secs, cpu, sleeps = await run_broker(broker, f"bench{i}", n, size, pubs, cons, rdy,
                                             pub, con)
                add(name, n, secs, cpu, sleeps)
        await cpu_rows(args, broker, add)
        if args.secure:
            tls: dict[str, object] = {"tls_v1": True, "tls_options": {"ca_certs": secure[1]}}
            choices: tuple[tuple[str, dict[str, object]], ...] = (
                ("tls", tls), ("deflate", {"deflate": True}), ("snappy", {"snappy": True}))
            for name, opts in choices:
                await cpu_rows(args, broker, add, f" {name}", opts)
    finally:
        broker.close()
        certs.cleanup()
    if args.null_store:
        broker = BrokerProcess(args.sync_every, *(["--uvloop"] if args.uvloop else []),
                               null_store=True)
        try:
            await cpu_rows(args, broker, add, " null")
        finally:
            broker.close()
    args.calibration.append(await calibration())
    args.hop.append(await hop_calibration())
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; prints a table (or JSON with ``--json``)."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--cpu-messages", type=int, default=50_000,
                   help="messages per pynsq CPU phase (default 50,000)")
    p.add_argument("--window", type=int, default=100,
                   help="unanswered PUBs of the pynsq PUB phase (default 100)")
    p.add_argument("--only-cpu", action="store_true", help="only the library and pynsq CPU rows")
    p.add_argument("--secure", action="store_true",
                   help="the pynsq rows again over TLS, deflate and snappy")
    p.add_argument("--null-store", action="store_true",
                   help="the pynsq rows again against a broker with no queue behind it "
                        "(bench/null_store_broker.py): the protocol's and sockets' floor")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--rdy", type=int, default=100)
    p.add_argument("--sync-every", type=int, default=2500)
    p.add_argument("--uvloop", action="store_true",
                   help="run the broker, the clients and the library row on uvloop")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.uvloop:
        import uvloop

        rows = uvloop.run(main_async(args))
    else:
        rows = asyncio.run(main_async(args))
    anchor, anchor_cpu = rows[0][2], rows[0][3]
    if args.json:
        print(json.dumps([{"row": r, "seconds": s, "msgs_per_s": m, "vs_library": m / anchor,
                           "cpu_us_per_msg": c, "cpu_vs_library": c / anchor_cpu,
                           "sleeps_per_msg": z}
                          for r, s, m, c, z in rows]
                         + [{"row": "calibration", "cpu_us_per_round_trip": args.calibration,
                             "measurements_md_round_trips_per_s": CALIBRATION_THEN,
                             "cpu_us_per_thread_hop": args.hop}]))
    else:
        print(f"\n{n_desc(args)}")
        print(f"{'row':30} {'msg/s':>10} {'vs library':>11} {'CPU us/msg':>11} {'CPU vs lib':>11}"
              f" {'sleeps/msg':>11}")
        for r, _s, m, c, z in rows:
            print(f"{r:30} {m:10.0f} {m / anchor:10.2f}x {c:11.1f} {c / anchor_cpu:10.2f}x"
                  f" {z:11.3f}")
        print("CPU us/msg: the broker process's (the library row: this process's). "
              "sleeps/msg: how often one of its threads blocked and was woken (voluntary "
              "context switches), per message.")
        print(calibration_line(args.calibration))
        print(hop_line(args.hop))
    return 0


def n_desc(args: argparse.Namespace) -> str:
    """One line describing the workload."""
    return (f"{args.messages} messages of {args.size} B, {args.publishers} publishers, "
            f"{args.consumers} consumers (RDY {args.rdy}), sync_every={args.sync_every}"
            + (", uvloop" if args.uvloop else ", asyncio loop"))


if __name__ == "__main__":
    sys.exit(main())

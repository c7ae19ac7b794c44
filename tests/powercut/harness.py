"""Power cuts: run a workload on the simulated disk, kill it, make crash images,
open each one and check the durability contract.

Used by ``tests/test_powercut.py`` and by ``bench/powercut.py`` (any number of cuts,
with a seed, and a table).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import glob
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import images  # noqa: E402
import workload  # noqa: E402

OPEN_TIMEOUT = 20.0  # seconds for one image to open and drain
GET_WAIT = 2.0  # seconds a get() may wait while qsize() says a message is left
KINDS = images.KINDS


def fuse_problem() -> str | None:
    """Why a FUSE filesystem cannot be mounted here, or None if it can."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 (Debian package fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot load libfuse3: {exc}"
    return None


class Mount:
    """A mounted :mod:`simfs` and its control channel."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.err = open(os.path.join(os.path.dirname(path), "simfs.log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "simfs.py"), path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        deadline = time.monotonic() + 20
        while not os.path.ismount(path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"simfs did not mount at {path} (see simfs.log)")
            time.sleep(0.02)

    def command(self, line: str) -> None:
        """Send one control command; raises RuntimeError if it fails."""
        stdin: IO[bytes] | None = self.proc.stdin
        stdout: IO[bytes] | None = self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(line.encode() + b"\n")
        stdin.flush()
        answer = stdout.readline().decode().strip()
        if answer != "ok":
            raise RuntimeError(f"simfs {line!r}: {answer!r}")

    def close(self) -> None:
        """Unmount and end the filesystem process."""
        # Unconditionally: a frozen filesystem answers stat with EIO, so ismount()
        # cannot tell.
        subprocess.run(["fusermount3", "-u", "-z", self.path], check=False,
                       stderr=subprocess.DEVNULL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


@contextlib.contextmanager
def mounted(path: str) -> Iterator[Mount]:
    """:class:`Mount` that is always unmounted."""
    m = Mount(path)
    try:
        yield m
    finally:
        m.close()


@dataclass
class Outcome:
    """What one crash image showed."""

    kind: str
    violations: list[tuple[str, str]] = field(default_factory=list)
    allowed: list[tuple[str, str]] = field(default_factory=list)
    """What the contract allows but is worth counting (a documented window)."""
    open_failed: bool = False
    hung: bool = False


@dataclass
class Cut:
    """One cut: its workload, its images, and where it was kept."""

    workload: str
    seed: int
    ran: float
    outcomes: list[Outcome]
    dropped: list[int]


class Acks:
    """What the report of one run says the queue acknowledged."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.attempted: set[tuple[int, int]] = set()
        self.acked: dict[tuple[int, int], int] = {}
        self.consumed: set[tuple[int, int]] = set()
        self.deliveries: collections.Counter[tuple[int, int]] = collections.Counter()
        self.consumed_at: dict[tuple[int, int], int] = {}
        last_sb = last_complete = -1
        self.purge_marker: str | None = None
        self.purge_at = -1
        self.empties_taken = 0  # ``E`` lines: empty messages a consumer took
        for i, line in enumerate(lines):
            w = line.split()
            if not w:
                continue
            if w[0] == "E":
                self.empties_taken += 1
                continue
            if w[0] in ("T", "A", "G", "B", "D") and w[1] != "?":
                key = (int(w[1]), int(w[2]))
                if w[0] == "D":
                    self.deliveries[key] += 1
                elif w[0] == "T":
                    self.attempted.add(key)
                elif w[0] == "A":
                    self.acked.setdefault(key, i)
                else:
                    self.consumed.add(key)
                    self.consumed_at.setdefault(key, i)
            elif w[0] == "SB":
                last_sb = i
            elif w[0] == "SE":
                last_complete = last_sb
            elif w[0] in ("PB", "PE"):
                self.purge_marker, self.purge_at = w[0], i
        self.synced_before = last_complete  # acks before this line were covered by a sync

    def required(self, wl: str) -> set[tuple[int, int]]:
        """The acknowledged messages the contract says come back (the empty ones of the
        ``empty`` workload apart: see :meth:`empties_required`)."""
        keys = {k for k in self.acked if k not in self.consumed and not self.is_empty(wl, k)}
        if wl in ("default", "ackdefault"):
            return {k for k in keys if self.acked[k] < self.synced_before}
        if wl == "brokerdefault":
            # The broker's default sync settings (nsqd's) promise nothing about a
            # published message after a power cut, and a client cannot ask for a sync:
            # the data directory opens, nothing comes that was never published.
            return set()
        if wl == "purge" and self.purge_marker is not None:
            if self.purge_marker == "PB":
                return set()
            return {k for k in keys if self.acked[k] > self.purge_at}
        return keys


    @staticmethod
    def is_empty(wl: str, key: tuple[int, int]) -> bool:
        """Whether ``key`` names an empty message (the ``empty`` workload's)."""
        return wl == "empty" and key[0] == workload.EMPTY_PRODUCER

    def empties_required(self, wl: str) -> int:
        """How many empty messages must come back at least: one producer puts them in
        order, so the consumer took a prefix of them; every acknowledged one after it
        comes back."""
        acked = sum(1 for k in self.acked if self.is_empty(wl, k))
        return max(0, acked - self.empties_taken)


class _Depth(list[str]):
    """Where qsize() and what get() delivers disagree."""


async def _drain_diskqueue(directory: str, name: str, depth: _Depth) -> list[bytes]:
    """Take messages while ``qsize()`` says some are left, then check that none is.

    Not ``range(qsize())`` taken at open: the depth at open is the meta's, and it is
    corrected when reading finds damage (records quarantined, or zeros that parse as
    records where a disk lost synced writes), so it may change during the drain.
    """
    from aiodiskqueue import DiskQueue

    out = []
    async with DiskQueue(directory, name) as q:
        while q.qsize():
            try:
                out.append(await asyncio.wait_for(q.get(), GET_WAIT))
            except TimeoutError:
                depth.append(f"qsize {q.qsize()}, yet get() waited {GET_WAIT} s ({q!r})")
                return out
        try:
            more = await asyncio.wait_for(q.get(), 0.05)
        except TimeoutError:
            pass
        else:
            depth.append(f"qsize 0, yet get() returned {more[:40]!r}")
            out.append(more)
    return out


async def _drain_ackqueue(directory: str, name: str,
                          depth: _Depth) -> tuple[list[bytes], list[bytes]]:
    from aiodiskqueue import AckQueue

    main: list[bytes] = []
    async with AckQueue(directory, name, max_attempts=0, msg_timeout=60.0) as q:
        while q.qsize():
            msg = await q.get()
            main.append(msg.body)
            await msg.finish()
    dead: list[bytes] = []
    dead_dir = os.path.join(directory, name + ".dead-letters")
    if os.path.isdir(dead_dir):
        dead = await _drain_diskqueue(dead_dir, name, depth)
    return main, dead


async def _drain_broker(directory: str, kind: str,
                        depth: _Depth) -> tuple[list[bytes], list[tuple[str, str]]]:
    """Every message of every store the broker reopens on restart (the topics and
    channels in its metadata file), each store drained as :func:`_drain_ackqueue`
    would; returns the bodies and ``(directory, store name)`` of each store."""
    from aiodiskqueue import AckQueue
    from aiodiskqueue.broker import BrokerOptions
    from aiodiskqueue.broker._broker import Broker

    opts = BrokerOptions(**workload.broker_options(kind))  # type: ignore[arg-type]
    stores: list[tuple[str, bool]] = []
    for t in Broker(directory, opts)._load_meta().get("topics", []):
        stores.append((t["name"], False))
        stores.extend((f"{t['name']}:{c['name']}", True) for c in t.get("channels", []))
    bodies: list[bytes] = []
    names: list[tuple[str, str]] = []
    for name, dead_letters in stores:
        kw = dict(opts.queue_options(dead_letters=dead_letters), max_attempts=0,
                  msg_timeout=60.0)
        async with AckQueue(directory, name, **kw) as q:
            while q.qsize():
                msg = await q.get()
                bodies.append(msg.body)
                await msg.finish()
        names.append((directory, name))
        dead_dir = os.path.join(directory, name + ".dead-letters")
        if os.path.isdir(dead_dir):
            bodies += await _drain_diskqueue(dead_dir, name, depth)
            names.append((dead_dir, name))
    return bodies, names


def _spark_jobs(acks: Acks, seen: collections.Counter[tuple[int, int]],
                allowed: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """The Spark batch write's promise (``aiodiskqueue/spark/_writer.py``): a job whose
    commit returned is in the queue whole (checked as ``lost``); one whose commit had
    not begun left nothing; one cut during its commit left nothing, all of it, or the
    records of a prefix of its staged files (the renames, in partition order, before
    the meta: the documented window, added to ``allowed`` when it happened)."""
    found = []
    size: dict[int, int] = {}
    ends: dict[int, list[int]] = {}
    committing: set[int] = set()
    for line in acks.lines:
        w = line.split()
        if w and w[0] == "J":
            size[int(w[1])] = int(w[2])
        elif w and w[0] == "S":
            ends[int(w[1])] = [int(x) for x in w[2:]]
        elif w and w[0] == "C":
            committing.add(int(w[1]))
    jobs = {p for p, _ in acks.attempted if p != workload.SPARK_EARLIER}
    for j in sorted(jobs):
        back = sorted(n for p, n in seen if p == j)
        if j not in committing:
            if back:
                found.append(("uncommitted", f"job {j}: {len(back)} record(s) of a job "
                                             "whose commit had not begun"))
        elif back and (back != list(range(len(back)))
                       or len(back) not in (size[j], *ends.get(j, []))):
            found.append(("partial", f"job {j}: {len(back)} of {size[j]} records back "
                                     f"(staged files end at {ends.get(j)}): {back[:8]}"))
        elif back and len(back) < size[j] and allowed is not None:
            allowed.append(("whole staged files of a cut commit",
                            f"job {j}: {len(back)} of {size[j]}"))
    return found


def _verify(directory: str, name: str) -> list[str]:
    from aiodiskqueue._format.layout import Layout
    from aiodiskqueue.errors import QueueNotFound
    from aiodiskqueue.tools.inspect import analyze

    try:
        report = analyze(Layout(directory, name))
    except QueueNotFound:
        return []
    return [str(p) for p in report.problems]


def check_image(wl: str, qdir: str, acks: Acks, timeout: float = OPEN_TIMEOUT) -> Outcome:
    """Open the queue in ``qdir`` (a crash image), drain it and check the contract."""
    out = Outcome("")
    bad = out.violations.append
    depth = _Depth()
    stores = [(qdir, workload.QUEUE)]
    try:
        if wl.startswith("ack"):
            main, dead = asyncio.run(asyncio.wait_for(
                _drain_ackqueue(qdir, workload.QUEUE, depth), timeout))
            bodies = main + dead
            stores.append((os.path.join(qdir, workload.QUEUE + ".dead-letters"),
                           workload.QUEUE))
        elif wl.startswith("broker"):
            main, stores = asyncio.run(asyncio.wait_for(
                _drain_broker(qdir, wl, depth), timeout)) if os.path.isdir(qdir) else ([], [])
            bodies = main
        else:
            main = bodies = asyncio.run(asyncio.wait_for(
                _drain_diskqueue(qdir, workload.QUEUE, depth), timeout)) \
                if os.path.isdir(qdir) else []
    except TimeoutError:
        out.hung = True
        return out
    except Exception as exc:  # noqa: BLE001 - every failure to open is a finding
        out.open_failed = True
        bad(("open", repr(exc)[:300]))
        return out
    for d in depth:
        bad(("depth", d))
    seen: collections.Counter[tuple[int, int]] = collections.Counter()
    last: dict[int, int] = {}
    empties = sum(1 for body in bodies if not body)
    if wl == "empty":
        # Empty messages are counted, not named: the marker makes recovery keep every
        # zero-length record, so a zero-filled tail may add some (the rule's documented
        # cost); none acknowledged may be missing.
        bodies = [body for body in bodies if body]
        if empties < acks.empties_required(wl):
            bad(("lost", f"{acks.empties_required(wl) - empties} acknowledged empty "
                         f"message(s): {empties} came back"))
    for body in bodies:
        key = workload.parse(body)
        if key is None or key not in acks.attempted:
            bad(("phantom", repr(body[:40])))
            continue
        seen[key] += 1
    # Deliveries in an AckQueue (and so in the broker's channels) are not in put order.
    if not wl.startswith(("ack", "broker")):
        for body in main:
            key = workload.parse(body)
            if key is None:
                continue
            p, n = key
            if n <= last.get(p, -1):
                bad(("order", f"{key} after {p, last[p]}"))
            last[p] = n
        for key, c in seen.items():
            if c > 1:
                bad(("duplicate", f"{key} x{c}"))
    if wl == "default":
        # sync() makes the read position durable: what was taken before it began is gone.
        back = sorted(k for k in seen if acks.consumed_at.get(k, 1 << 62) < acks.synced_before)
        if back:
            bad(("resurrected", f"{len(back)} taken before the last sync(): {back[:5]}"))
    if wl == "spark":
        out.violations.extend(_spark_jobs(acks, seen, out.allowed))
    lost = sorted(acks.required(wl) - set(seen))
    # An AckQueue message delivered max_attempts times was due in the dead-letter queue.
    due = [k for k in lost if acks.deliveries[k] >= workload.MAX_ATTEMPTS]
    lost = [k for k in lost if k not in due]
    if lost:
        bad(("lost", f"{len(lost)} acknowledged: {lost[:5]}"))
    if due:
        bad(("lost dead letter", f"{len(due)} acknowledged, due as dead letters: {due[:5]}"))
    for d, name in stores:
        if os.path.isdir(d):
            for problem in _verify(d, name):
                bad(("verify", problem[:200]))
    for d in {d for d, _ in stores}:
        if os.path.isdir(d):
            for path in glob.glob(os.path.join(d, "*.bad*")):
                with open(path, "rb") as f:
                    held = f.read()
                keys = [k for k in acks.acked
                        if not acks.is_empty(wl, k) and workload.payload(*k) in held]
                if keys:
                    bad(("quarantined", f"{os.path.basename(path)} holds acknowledged "
                                        f"{keys[:3]}"))
    return out


def _wait_group_gone(pgid: int, timeout: float = 10.0) -> None:
    """Wait until no live process of group ``pgid`` is left (zombies aside), so no
    report line comes after the cut."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[-1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != b"Z":
                live = True
                break
        if not live:
            return
        time.sleep(0.005)
    raise RuntimeError(f"processes of group {pgid} outlived SIGKILL for {timeout} s")


def run_cut(mount: Mount, wl: str, seed: int, work: str, images_per_kind: int = 1,
            max_run: float = 0.6, drop_sync: int = 0,
            kinds: tuple[str, ...] = KINDS, timeout: float = OPEN_TIMEOUT) -> Cut:
    """One cut: run workload ``wl`` on ``mount``, SIGKILL it after a random time, and
    check crash images of each kind (``images_per_kind`` of the random kinds)."""
    rng = random.Random(seed)
    mount.command("reset")
    if drop_sync:
        mount.command(f"drop_sync {drop_sync}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    report = os.path.join(work, "report")
    qdir = os.path.join(mount.path, "q")
    os.mkdir(qdir)
    fd = os.open(mount.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)  # the queue's directory is the user's: durable before the workload
    finally:
        os.close(fd)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE), *sys.path]))
    # A session of its own: the cut kills the workload's process group at once (a
    # workload may run several processes: a consumer process, a broker).
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "workload.py"), wl, qdir,
                             report, str(seed)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    start = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"workload {wl} ended: {proc.stderr.read()[-2000:]!r}"
                                   if proc.stderr else "workload ended")
            if os.path.exists(report) and os.path.getsize(report) > 0:
                with open(report, "rb") as f:
                    if b"READY\n" in f.read():
                        break
            if time.monotonic() - start > 30:
                raise RuntimeError(f"workload {wl} did not open its queue in 30 s")
            time.sleep(0.005)
        ran = rng.uniform(0.0, max_run)
        time.sleep(ran)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _wait_group_gone(proc.pid)
        if proc.stderr:
            proc.stderr.close()
    dump_path = os.path.join(work, "dump.pkl")
    mount.command(f"cut {dump_path}")
    with open(dump_path, "rb") as f:
        dump: dict[str, Any] = pickle.load(f)
    with open(report) as f:
        acks = Acks(f.read().splitlines())
    outcomes = []
    for kind in kinds:
        for i in range(1 if kind in ("durable", "zeros") else images_per_kind):
            root = os.path.join(work, f"{kind}{i}")
            images.materialize(images.make_image(dump, kind, rng), dump["kinds"], root)
            o = check_image(wl, os.path.join(root, "q"), acks, timeout)
            o.kind = kind
            outcomes.append(o)
            if not (o.violations or o.hung):
                shutil.rmtree(root)
    return Cut(wl, seed, ran, outcomes, dump["dropped"])


def table(cuts: list[Cut]) -> str:
    """Cuts, images, violations by kind, open failures and hangs, per workload and
    image kind."""
    rows: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(
        collections.Counter)
    vkinds: set[str] = set()
    akinds: set[str] = set()  # not violations: what a documented window allows
    for c in cuts:
        rows[(c.workload, "*")]["cuts"] += 1
        for o in c.outcomes:
            r = rows[(c.workload, o.kind)]
            r["images"] += 1
            r["open failures"] += o.open_failed
            r["hangs"] += o.hung
            for v in {v for v, _ in o.violations}:
                r[v] += 1
                vkinds.add(v)
            for a in {f"allowed: {a}" for a, _ in o.allowed}:
                r[a] += 1
                akinds.add(a)
    cols = ["cuts", "images", *sorted(vkinds - {"open"}), "open failures", "hangs",
            *sorted(akinds)]
    if "open" in vkinds:
        cols.insert(cols.index("open failures"), "open")
    lines = ["| workload | image | " + " | ".join(cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for (wl, kind) in sorted(rows):
        if kind == "*":
            continue
        r = rows[(wl, kind)]
        r["cuts"] = rows[(wl, "*")]["cuts"]
        lines.append(f"| {wl} | {kind} | " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(lines)

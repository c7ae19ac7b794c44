"""Who may read the files: ``file_mode`` and ``dir_mode``.

Every file and directory the library creates gets exactly the mode asked for (owner-only
by default, as go-diskqueue), whatever the umask; a process that may not open a file
gets a QueuePermissionError naming it. The checks walk whole directories, so a new
kind of file created without the mode fails them. The tests with a second user run a
child process as uid 65534 (nobody): they need root, as these tests run in CI.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiodiskqueue import AckQueue, DiskQueue, QueuePermissionError
from aiodiskqueue._format.layout import Layout
from aiodiskqueue.errors import DiskQueueError
from aiodiskqueue.tools.cli import main as cli_main

NOBODY = 65534  # uid and gid of the child process that plays the other user
SHARED_GID = 65534  # the group the two users share in the group tests

DEFAULT = (0o600, 0o700)


def modes(root: Path) -> dict[str, int]:
    """The permission bits of every file and directory under ``root`` (itself included)."""
    out = {".": stat.S_IMODE(os.stat(root).st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


def assert_modes(root: Path, file_mode: int, dir_mode: int) -> None:
    wrong = {}
    for rel, mode in modes(root).items():
        want = dir_mode if os.path.isdir(root / rel) else file_mode
        if mode != want:
            wrong[rel] = f"{mode:#o}, want {want:#o}"
    assert not wrong, wrong


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


# ---------------------------------------------------------------------- every kind of file


async def _every_kind(d: Path, **modes_: Any) -> None:
    """Make every kind of file a queue makes: segments (rolled), meta, its spare and temp,
    lock, empty-message marker, a quarantined copy, role files, ack log, dead letters and
    their directory."""
    async with DiskQueue(d / "plain", "q", max_bytes_per_file=64, **modes_) as q:
        await q.put_many([b"x" * 20] * 10)
        await q.put(b"")
        for _ in range(5):
            await q.get()
    lay = Layout(str(d / "plain"), "q")
    last = max(lay.segments())
    with open(lay.segment_path(3), "r+b") as f:
        f.write(b"\xff\xff\xff\xff")  # a bad length, unread: quarantined when read
    with open(lay.segment_path(last), "ab") as f:
        f.write(b"\xff\xff\xff\xff" + b"y" * 30)  # past the meta: saved as .bad on open
    async with DiskQueue(d / "plain", "q", max_bytes_per_file=64, **modes_) as q:
        while not q.empty():
            await asyncio.wait_for(q.get(), 30)
        assert q.statistics().bad_files >= 1
    async with DiskQueue(d / "roles", "q", role="producer", **modes_) as p, \
            DiskQueue(d / "roles", "q", role="consumer", **modes_) as c:
        await p.put(b"m")
        assert await asyncio.wait_for(c.get(), 30) == b"m"
    async with AckQueue(d / "ack", "q", max_attempts=1, **modes_) as a:
        await a.put(b"poison")
        await a.put(b"fine")
        m = await asyncio.wait_for(a.get(), 30)
        await m.requeue()  # out of attempts: dead-lettered
        ok = await asyncio.wait_for(a.get(), 30)
        await ok.finish()
        assert await asyncio.wait_for(a.dead_letters.get(), 30) == b"poison"
    async with AckQueue(d / "ack-roles", "q", role="producer", **modes_) as p:
        await p.put(b"a")
    async with AckQueue(d / "ack-roles", "q", role="consumer", **modes_) as c:
        await (await asyncio.wait_for(c.get(), 30)).finish()


async def test_every_file_is_owner_only_by_default(tmp_path: Path, umask_022: None) -> None:
    d = tmp_path / "q"
    await _every_kind(d)
    kinds = {os.path.basename(p).split(".", 1)[-1] for p in modes(d)}
    # The walk saw the kinds of file it is meant to check.
    for kind in ("diskqueue.000000.dat", "diskqueue.meta.dat", "diskqueue.lock",
                 "diskqueue.empty", "diskqueue.producer", "diskqueue.consumer",
                 "diskqueue.roles", "ack.000000.log", "dead-letters",
                 "diskqueue.000003.dat.bad", "diskqueue.000004.dat.bad"):
        assert kind in kinds, sorted(kinds)
    assert_modes(d, *DEFAULT)


@pytest.mark.parametrize(("file_mode", "dir_mode", "umask"), [
    (0o640, 0o750, 0o022),
    (0o660, 0o770, 0o022),
    (0o660, 0o770, 0o077),
    (0o600, 0o700, 0o000),
], ids=["640-umask022", "660-umask022", "660-umask077", "600-umask000"])
async def test_a_mode_applies_exactly_whatever_the_umask(
        tmp_path: Path, file_mode: int, dir_mode: int, umask: int) -> None:
    old = os.umask(umask)
    try:
        await _every_kind(tmp_path / "q", file_mode=file_mode, dir_mode=dir_mode)
    finally:
        os.umask(old)
    assert_modes(tmp_path / "q", file_mode, dir_mode)


async def test_the_parents_a_queue_creates_get_dir_mode(tmp_path: Path,
                                                         umask_022: None) -> None:
    async with DiskQueue(tmp_path / "a" / "b" / "c", "q", dir_mode=0o750) as q:
        await q.put(b"x")
    assert [modes(tmp_path / p)["."] for p in ("a", "a/b", "a/b/c")] == [0o750] * 3


async def test_existing_files_keep_their_mode(tmp_path: Path, umask_022: None) -> None:
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=64) as q:
        await q.put(b"x" * 20)
    before = modes(tmp_path)
    os.chmod(tmp_path / "q.diskqueue.000000.dat", 0o644)  # changed by an administrator
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=64, file_mode=0o660) as q:
        await q.put_many([b"y" * 20] * 4)  # rolls: new segments
    after = modes(tmp_path)
    assert after["q.diskqueue.000000.dat"] == 0o644
    assert after["q.diskqueue.lock"] == before["q.diskqueue.lock"] == 0o600
    new = [n for n in after if n not in before and n.endswith(".dat")]
    assert new and all(after[n] == 0o660 for n in new)


def test_the_sync_facades_pass_the_modes_on(tmp_path: Path, umask_022: None) -> None:
    from aiodiskqueue import sync

    with sync.DiskQueue(tmp_path / "d", "q", file_mode=0o640, dir_mode=0o750) as q:
        q.put(b"x")
    with sync.AckQueue(tmp_path / "a", "q", file_mode=0o640, dir_mode=0o750) as a:
        a.put(b"x")
        a.get().finish()
    assert_modes(tmp_path / "d", 0o640, 0o750)
    assert_modes(tmp_path / "a", 0o640, 0o750)


@pytest.mark.parametrize(("file_mode", "dir_mode"), [DEFAULT, (0o660, 0o770)])
async def test_a_queue_group_s_files_follow_the_modes(tmp_path: Path, umask_022: None,
                                                      file_mode: int, dir_mode: int) -> None:
    """The group directory, its meta, lock and member files, every shard and an
    AckQueueGroup's ack logs and dead letters."""
    from aiodiskqueue import AckQueueGroup, QueueGroup

    extra: dict[str, Any] = ({} if (file_mode, dir_mode) == DEFAULT
                             else {"file_mode": file_mode, "dir_mode": dir_mode})
    root = tmp_path / "d"
    async with QueueGroup(root, "g", **extra) as p1, QueueGroup(root, "g", **extra) as p2:
        await p1.put(b"a")
        await p2.put(b"b")
        async with QueueGroup(root, "g", "consumer", **extra) as c:
            got = {await asyncio.wait_for(c.get(), 10) for _ in range(2)}
            assert got == {b"a", b"b"}
            assert_modes(root, file_mode, dir_mode)  # the member file is there now
    async with AckQueueGroup(root, "a", max_attempts=1, **extra) as p:
        await p.put(b"x")
    async with AckQueueGroup(root, "a", "consumer", max_attempts=1, **extra) as c:
        m = await asyncio.wait_for(c.get(), 10)
        await m.requeue()  # its last attempt: a dead letter
    from aiodiskqueue.sync import QueueGroup as SyncQueueGroup
    with SyncQueueGroup(root, "s", **extra) as s:
        s.put(b"y")
    assert os.path.isdir(root / "g.group" / "000001")
    assert any(n.endswith(".dead-letters") for n in os.listdir(root / "a.group" / "000000"))
    assert_modes(root, file_mode, dir_mode)


async def test_the_broker_s_data_is_owner_only(tmp_path: Path, umask_022: None) -> None:
    from aiodiskqueue.broker._broker import Broker

    b = Broker(tmp_path / "data")
    await b.start()
    try:
        topic = await b.get_topic("t")
        await b.get_channel(topic, "c")
        await b.persist_meta()
    finally:
        await b.aclose()
    names = modes(tmp_path / "data")
    assert any(n.endswith(".dat") for n in names) and any(n.endswith(".log") for n in names)
    assert_modes(tmp_path / "data", *DEFAULT)


# ---------------------------------------------------------------------- tools and Spark


def _damaged_queue(d: Path, file_mode: int) -> None:
    async def fill() -> None:
        async with DiskQueue(d, "q", max_bytes_per_file=64, file_mode=file_mode,
                             dir_mode=0o700 if file_mode == 0o600 else 0o750) as q:
            await q.put_many([b"x" * 20] * 6)
    asyncio.run(fill())
    lay = Layout(str(d), "q")
    with open(lay.segment_path(0), "r+b") as f:
        f.seek(24)
        f.write(b"\xff\xff\xff\xff")  # a bad length: segment 0's second record
    with open(lay.segment_path(2), "ab") as tail:
        tail.write(b"\x00\x00\x00\x10abc")  # a torn tail
    os.remove(lay.meta_path)  # rewritten by the repair


@pytest.mark.parametrize("file_mode", [0o600, 0o640], ids=["600", "640"])
def test_repair_files_follow_the_queue_s_mode(tmp_path: Path, file_mode: int,
                                              umask_022: None,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "q"
    _damaged_queue(d, file_mode)
    assert cli_main(["repair", "--no-progress", str(d), "q"]) == 0, capsys.readouterr()
    names = modes(d)
    assert any(".bad" in n for n in names), names  # the quarantined copy
    assert "q.diskqueue.meta.dat" in names
    assert_modes(d, file_mode, modes(d)["."])


def test_repair_file_mode_flag(tmp_path: Path, umask_022: None,
                               capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "q"
    _damaged_queue(d, 0o600)
    os.remove(d / "q.diskqueue.lock")
    for p in d.glob("q.diskqueue.meta.dat*"):
        os.remove(p)
    assert cli_main(["repair", "--no-progress", "--file-mode", "660", str(d), "q"]) == 0
    m = modes(d)
    assert m["q.diskqueue.meta.dat"] == m["q.diskqueue.lock"] == 0o660
    bad = [n for n in m if ".bad" in n]
    assert bad and all(m[n] == 0o600 for n in bad)  # the mode of the segment it copies
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_main(["repair", "--file-mode", "400", str(d), "q"])
    assert "--file-mode: must let the owner read and write (0o600), got 0o400" in \
        capsys.readouterr().err


def test_spark_sink_stages_and_links_with_the_queue_s_mode(tmp_path: Path,
                                                          umask_022: None) -> None:
    pa = pytest.importorskip("pyarrow")
    types = pytest.importorskip("pyspark.sql.types")
    from aiodiskqueue.spark._options import parse_options
    from aiodiskqueue.spark._writer import DiskQueueStreamWriter, DiskQueueWriter

    schema = types.StructType([types.StructField("payload", types.BinaryType())])

    def batch() -> Iterator[Any]:
        yield pa.record_batch([pa.array([b"a", b"bc"], pa.binary())], names=["payload"])

    new = tmp_path / "new"  # a queue Spark creates: owner-only
    w = DiskQueueWriter(parse_options({"path": str(new), "name": "q"}), schema, False)
    msg = w.write(batch())
    assert any(n.endswith(".dat") for n in modes(new))  # staged, not linked yet
    assert_modes(new, *DEFAULT)
    w.commit([msg])
    assert_modes(new, *DEFAULT)

    shared = tmp_path / "shared"  # an existing group-shared queue stays so
    async def make() -> None:
        async with DiskQueue(shared, "q", file_mode=0o660, dir_mode=0o770) as q:
            await q.put(b"first")
    asyncio.run(make())
    s = DiskQueueStreamWriter(parse_options({"path": str(shared), "name": "q",
                                             "writerId": "w"}), schema, False)
    msg = s.write(batch())
    assert any(".spark" in n or "stag" in n for n in modes(shared)), modes(shared)
    assert_modes(shared, 0o660, 0o770)
    s.commit([msg], 0)
    assert any(n.endswith("spark-sink.json") for n in modes(shared))
    assert_modes(shared, 0o660, 0o770)

    async def drain() -> list[bytes]:
        async with DiskQueue(shared, "q") as q:
            return [await asyncio.wait_for(q.get(), 30) for _ in range(3)]
    assert asyncio.run(drain()) == [b"first", b"a", b"bc"]


def test_spark_sink_file_mode_options(tmp_path: Path, umask_022: None) -> None:
    pa = pytest.importorskip("pyarrow")
    types = pytest.importorskip("pyspark.sql.types")
    from aiodiskqueue.spark._options import OptionError, parse_options
    from aiodiskqueue.spark._writer import DiskQueueWriter

    schema = types.StructType([types.StructField("payload", types.BinaryType())])
    d = tmp_path / "q"
    w = DiskQueueWriter(parse_options({"path": str(d), "name": "q", "fileMode": "0660",
                                       "dirMode": "0o770"}), schema, False)
    w.commit([w.write(iter([pa.record_batch([pa.array([b"a"], pa.binary())],
                                            names=["payload"])]))])
    assert_modes(d, 0o660, 0o770)
    for value, problem in [("rw", "must be an octal mode such as 660, got 'rw'"),
                           ("999", "must be an octal mode such as 660, got '999'"),
                           ("400", "must let the owner read and write (0o600), got 0o400")]:
        with pytest.raises(OptionError) as info:
            parse_options({"path": str(d), "name": "q", "fileMode": value})
        assert str(info.value) == f"diskqueue: option 'fileMode' {problem}"
    with pytest.raises(OptionError, match=r"^diskqueue: option 'dirMode' must let the owner "
                                          r"read, write and search \(0o700\), got 0o600$"):
        parse_options({"path": str(d), "name": "q", "dirMode": "600"})


# ---------------------------------------------------------------------- bad values


@pytest.mark.parametrize(("option", "value", "error", "message"), [
    ("file_mode", "0o600", TypeError, "file_mode must be an int such as 0o600, got str '0o600'"),
    ("file_mode", True, TypeError, "file_mode must be an int such as 0o600, got bool True"),
    ("file_mode", 0o1000, ValueError,
     "file_mode must be a permission mode in [0o0, 0o777], got 0o1000"),
    ("file_mode", -1, ValueError, "file_mode must be a permission mode in [0o0, 0o777], got -0o1"),
    ("file_mode", 0o4600, ValueError,
     "file_mode must be a permission mode in [0o0, 0o777], got 0o4600"),
    ("file_mode", 0o400, ValueError,
     "file_mode must let the owner read and write (0o600), got 0o400"),
    ("file_mode", 0o066, ValueError,
     "file_mode must let the owner read and write (0o600), got 0o66"),
    ("dir_mode", 0o600, ValueError,
     "dir_mode must let the owner read, write and search (0o700), got 0o600"),
    ("dir_mode", 0o2770, ValueError,
     "dir_mode must be a permission mode in [0o0, 0o777], got 0o2770"),
], ids=["str", "bool", "too-big", "negative", "setuid", "owner-read-only", "group-only",
        "dir-no-search", "dir-setgid"])
@pytest.mark.parametrize("cls", [DiskQueue, AckQueue], ids=lambda c: c.__name__)
def test_a_bad_mode_is_refused_naming_it(tmp_path: Path, cls: Any, option: str, value: object,
                                         error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        cls(tmp_path / "q", "q", **{option: value})
    assert str(info.value) == message
    assert not (tmp_path / "q").exists()


# ---------------------------------------------------------------------- another user


def _can_switch_user() -> bool:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    probe = subprocess.run([sys.executable, "-c", f"import os; os.setgroups([]); "
                            f"os.setgid({NOBODY}); os.setuid({NOBODY})"],
                           capture_output=True, timeout=60, check=False)
    return probe.returncode == 0


needs_root = pytest.mark.skipif(
    not _can_switch_user(),
    reason="runs a second process as another uid (65534): needs root, and a system that "
           "lets root switch to that uid")

# The interpreter may live where only root may read (a pyenv under /root): the child
# starts as root, imports what it uses, then becomes the other user with setgroups,
# setgid and setuid, as subprocess's user= and group= would before exec.
_BECOME = r"""
import asyncio, concurrent.futures.thread, json, os, sys  # imported lazily otherwise
import aiodiskqueue, aiodiskqueue.tools.cli
from aiodiskqueue import DiskQueue, QueuePermissionError
os.setgroups([])
os.setgid(int(sys.argv.pop(1)))
os.setuid(int(sys.argv.pop(1)))
"""

_CONSUMER = r"""
from aiodiskqueue import AckQueue

async def take(q):
    m = await asyncio.wait_for(q.get(), 30)
    if isinstance(q, AckQueue):
        await m.finish()
        return m.body.decode()
    return m.decode()

async def main(directory, role, n, file_mode, dir_mode, kind):
    cls = AckQueue if kind == "AckQueue" else DiskQueue
    more = {"max_attempts": 5} if kind == "AckQueue" else {}  # a dead-letter directory
    try:
        async with cls(directory, "q", role=role, file_mode=file_mode,
                       dir_mode=dir_mode, **more) as q:
            got = [await take(q) for _ in range(n)]
        print(json.dumps({"got": got}))
    except QueuePermissionError as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e), "path": e.path,
                          "mode": e.mode, "uid": e.uid,
                          "permission_error": isinstance(e, PermissionError)}))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4], 8),
                 int(sys.argv[5], 8), sys.argv[6]))
"""

_CLI = "sys.exit(aiodiskqueue.tools.cli.main(sys.argv[1:]))"


def _as_nobody(code: str, args: list[str], group: int = NOBODY
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _BECOME + code, str(group), str(NOBODY),
                           *args], cwd="/", capture_output=True, text=True, timeout=120,
                          check=False)


def _child(directory: Path, role: str = "consumer", n: int = 1, file_mode: int = 0o600,
           dir_mode: int = 0o700, group: int = NOBODY, kind: str = "DiskQueue"
           ) -> dict[str, Any]:
    res = _as_nobody(_CONSUMER, [str(directory), role, str(n), f"{file_mode:o}",
                                 f"{dir_mode:o}", kind], group)
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A directory both users can enter (``tmp_path``'s parents are root's alone)."""
    with tempfile.TemporaryDirectory(prefix="aiodiskqueue-mode-") as d:
        os.chmod(d, 0o755)
        yield Path(d)


async def _produce(d: Path, items: list[bytes], **opts: Any) -> None:
    async with DiskQueue(d, "q", role="producer", **opts) as p:
        await p.put_many(items)


@needs_root
async def test_another_user_gets_a_permission_error_naming_the_directory(
        shared_root: Path) -> None:
    d = shared_root / "q"
    await _produce(d, [b"secret"])  # the defaults: owner-only
    out = _child(d)
    assert out["error"] == "QueuePermissionError" and out["permission_error"], out
    assert out["mode"] == 0o700 and out["uid"] == 0, out
    assert out["message"].startswith(f"permission denied: {d}: mode 0o700, owner root:root "
                                     "(uid 0, gid 0); "), out
    assert "this process runs as nobody (uid 65534" in out["message"]
    assert "file_mode=0o660, dir_mode=0o770" in out["message"]


@needs_root
async def test_another_user_gets_a_permission_error_naming_the_file(
        shared_root: Path) -> None:
    d = shared_root / "q"
    await _produce(d, [b"secret"], dir_mode=0o777)  # a directory anyone may enter
    os.chmod(d, 0o777)
    out = _child(d)
    assert out["error"] == "QueuePermissionError", out
    assert out["path"].startswith(str(d / "q.diskqueue.")) and out["mode"] == 0o600, out
    assert f"permission denied: {out['path']}: mode 0o600, owner root:root" in out["message"]


_UNREADABLE_SEGMENT = r"""
async def main():
    where = "open"
    try:
        async with DiskQueue(sys.argv[1], "q", role="consumer", file_mode=0o660,
                             dir_mode=0o770) as q:
            where = "get"
            await asyncio.wait_for(q.get(), 60)
    except QueuePermissionError as e:
        print(where, e.path, oct(e.mode))
asyncio.run(main())
"""


@needs_root
@pytest.mark.parametrize("producer_live", [False, True], ids=["closed", "live"])
async def test_a_segment_the_consumer_may_not_read_raises_never_hangs(
        shared_root: Path, producer_live: bool) -> None:
    # Every file shared but one segment. Without a producer the consumer scans the tail
    # on open; beside a live one it reads the segment in get().
    d = shared_root / "q"
    os.mkdir(d, 0o770)
    os.chown(d, 0, SHARED_GID)
    os.chmod(d, 0o2770)  # setgid: files made inside get the directory's group
    seg = Layout(str(d), "q").segment_path(0)
    async with DiskQueue(d, "q", role="producer", file_mode=0o660, dir_mode=0o770) as p:
        await p.put(b"secret")
        await p.sync()
        os.chmod(seg, 0o600)
        if producer_live:
            res = await asyncio.to_thread(_as_nobody, _UNREADABLE_SEGMENT, [str(d)],
                                          SHARED_GID)
    if not producer_live:
        res = _as_nobody(_UNREADABLE_SEGMENT, [str(d)], SHARED_GID)
    assert res.returncode == 0, res.stderr
    want = "get" if producer_live else "open"
    assert res.stdout.split() == [want, seg, "0o600"], res.stdout


_PRODUCER_SYNC = r"""
async def main():
    p = await DiskQueue.open(sys.argv[1], "q", role="producer", file_mode=0o660,
                             dir_mode=0o770)
    await p.put(b"late")
    print("open", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    try:
        await asyncio.wait_for(p.sync(), 60)
        print("synced")
    except QueuePermissionError as e:
        print("denied", e.path, oct(e.mode))
    try:
        await asyncio.wait_for(p.aclose(), 60)
    except Exception as e:
        print("close", type(e).__name__)
asyncio.run(main())
"""


@needs_root
def test_a_meta_file_the_producer_may_no_longer_read_fails_its_sync(
        shared_root: Path) -> None:
    # Made owner-only while the producer runs (as by another process opened with the
    # default modes): its next meta store raises, the put itself stays on disk.
    d = shared_root / "q"
    os.mkdir(d)
    os.chown(d, 0, SHARED_GID)
    os.chmod(d, 0o2770)

    async def make() -> None:
        async with DiskQueue(d, "q", file_mode=0o660, dir_mode=0o770) as q:
            await q.put(b"first")
    asyncio.run(make())
    meta = Layout(str(d), "q").meta_path
    child = subprocess.Popen(
        [sys.executable, "-c", _BECOME + _PRODUCER_SYNC, str(SHARED_GID), str(NOBODY),
         str(d)], cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "open\n"
        os.chmod(meta, 0o600)
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert out.split()[:3] == ["denied", meta, "0o600"], (out, err)

    async def drain() -> list[bytes]:
        async with DiskQueue(d, "q") as q:
            return [await asyncio.wait_for(q.get(), 30) for _ in range(2)]
    assert asyncio.run(drain()) == [b"first", b"late"]


@needs_root
@pytest.mark.parametrize("kind", [DiskQueue, AckQueue], ids=lambda c: c.__name__)
async def test_group_sharing_producer_as_root_consumer_as_another_user(
        shared_root: Path, kind: Any) -> None:
    # The documented setup: a directory of the shared group with the setgid bit, and both
    # roles opened with the group's modes.
    file_mode, dir_mode = 0o660, 0o770
    d = shared_root / "q"
    os.mkdir(d)
    os.chown(d, 0, SHARED_GID)
    os.chmod(d, 0o2000 | dir_mode)
    items = [b"m%d" % i for i in range(50)]
    async with kind(d, "q", role="producer", file_mode=file_mode, dir_mode=dir_mode) as p:
        for it in items[:20]:
            await p.put(it)
        consumer = asyncio.create_task(asyncio.to_thread(
            _child, d, "consumer", len(items), file_mode, dir_mode, SHARED_GID,
            kind.__name__))
        for it in items[20:]:
            await p.put(it)
        out = await asyncio.wait_for(consumer, 120)
    assert out == {"got": [i.decode() for i in items]}
    # What the consumer created (its meta stores, ack log, dead-letter directory) is the
    # group's too; a directory made inside keeps the set-group-ID bit.
    made = modes(d)
    if kind is AckQueue:
        assert made["q.dead-letters"] == 0o2000 | dir_mode
    for p_, mode in made.items():
        if p_ != "." and not os.path.isdir(d / p_):
            assert mode == file_mode, (p_, oct(mode))
        assert os.stat(d / p_).st_gid == SHARED_GID, p_
    async with kind(d, "q") as q:  # closed by both: whole again, nothing left
        assert q.qsize() == 0
    assert any(n.endswith(".log") for n in modes(d)) == (kind is AckQueue)


@needs_root
def test_cli_names_a_file_it_may_not_read(shared_root: Path) -> None:
    d = shared_root / "q"
    asyncio.run(_produce(d, [b"secret"], dir_mode=0o755))
    os.chmod(d, 0o755)
    res = _as_nobody(_CLI, ["inspect", "--no-progress", str(d), "q"])
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stderr.startswith(f"aiodiskqueue: permission denied: {d}/q.diskqueue."), \
        res.stderr
    assert "mode 0o600, owner root:root" in res.stderr


@needs_root
def test_cli_names_a_directory_it_may_not_enter(shared_root: Path) -> None:
    d = shared_root / "q"
    asyncio.run(_produce(d, [b"secret"]))  # directory 0o700
    res = _as_nobody(_CLI, ["verify", "--no-progress", str(d), "q"])
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stderr.startswith(f"aiodiskqueue: permission denied: {d}: mode 0o700, "
                                 "owner root:root"), res.stderr


def test_the_error_is_a_permission_error_and_a_queue_error() -> None:
    assert issubclass(QueuePermissionError, PermissionError)
    assert issubclass(QueuePermissionError, DiskQueueError)
    e = QueuePermissionError("/x/q.diskqueue.lock", 0o600, 0, 0, "permission denied: ...")
    assert (e.errno, e.path, e.mode, str(e)) == (13, "/x/q.diskqueue.lock", 0o600,
                                                  "permission denied: ...")

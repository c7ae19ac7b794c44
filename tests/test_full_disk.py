"""A full or read-only filesystem, for real: each test mounts a 1 MiB tmpfs, or an ext4
image that the kernel remounts read-only (as after a disk error) while the queue is open.

Mounting needs root (CI runs the suite as root). Without it these tests FAIL
with the reason, so a run that cannot exercise them never looks green; set
``AIODISKQUEUE_NO_MOUNT=1`` to skip them instead (the reason is in the skip).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers_fs import take_every_free_byte

from aiodiskqueue import AckQueue, DiskQueue, DiskQueueError
from aiodiskqueue._format import meta as meta_module
from aiodiskqueue._format.meta import Meta, load_meta, store_meta

MSG = 1000  # bytes per message: a 1 MiB filesystem holds about a thousand
OPTS: dict[str, Any] = {"max_bytes_per_file": 64 * 1024}
SPARE = "q.diskqueue.meta.dat.0.tmp"


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def msg(i: int) -> bytes:
    return b"%08d" % i + b"x" * (MSG - 8)


async def fill(q: DiskQueue | AckQueue) -> list[bytes]:
    """Put messages until the filesystem is full; return those stored."""
    stored: list[bytes] = []

    async def put_all() -> None:
        for i in range(10_000):
            await q.put(msg(i))
            stored.append(msg(i))

    with pytest.raises(DiskQueueError) as ei:
        await put_all()
    cause = ei.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC, ei.value
    return stored


def fill_with_file(path: Path) -> None:
    """Take every free byte of the filesystem with one file."""
    assert take_every_free_byte(path) > 0
    assert free_bytes(path.parent) == 0


@pytest.mark.parametrize("fs", ["tmpfs", "ext4"])
def test_meta_stores_on_a_full_disk_need_no_block_freed_before(
        fs: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer on the disk takes every block as soon as it is freed (here: at
    each directory fsync of a store); meta stores go on working all the same."""
    mnt: Path = (request.getfixturevalue("small_fs") if fs == "tmpfs"
                 else request.getfixturevalue("ext4_fs")[0])
    path = str(mnt / "q.diskqueue.meta.dat")
    store_meta(path, Meta(0, 0, 0, 0, 0))  # the meta, and its spare
    fill_with_file(mnt / "filler")
    thefts = 0
    real = meta_module.fsync_dir  # type: ignore[attr-defined]  # the name store_meta calls

    def fsync_dir_and_take_what_is_free(directory: str) -> None:
        nonlocal thefts
        real(directory)
        thefts += 1
        take_every_free_byte(mnt / f"thief{thefts}")

    monkeypatch.setattr(meta_module, "fsync_dir", fsync_dir_and_take_what_is_free)
    for i in range(1, 6):
        store_meta(path, Meta(i, 0, i, 0, 1000 * i))
        assert load_meta(path) == Meta(i, 0, i, 0, 1000 * i)
    assert thefts == 5 and os.path.exists(mnt / SPARE)


async def drain(q: DiskQueue) -> list[bytes]:
    out = []
    while q.qsize():
        out.append(await asyncio.wait_for(q.get(), 10))
    return out


async def test_drain_of_a_full_disk_frees_space_and_puts_resume(small_fs: Path) -> None:
    q = await DiskQueue.open(small_fs, "q", **OPTS)
    try:
        stored = await fill(q)
        assert free_bytes(small_fs) < 64 * 1024
        assert await drain(q) == stored
        # Consumed segments go only once a meta past them is stored: on a full disk
        # that store uses the preallocated spare file.
        await q.sync()
        assert free_bytes(small_fs) > 700 * 1024
        more = [msg(i) for i in range(100)]
        await q.put_many(more)
        assert await drain(q) == more
    finally:
        await q.aclose()


async def test_close_returns_when_the_meta_cannot_be_stored(
        small_fs: Path, caplog: pytest.LogCaptureFixture) -> None:
    q = await DiskQueue.open(small_fs, "q", **OPTS)
    stored = await fill(q)
    os.remove(small_fs / SPARE)  # no spare, and no byte left for a temp file
    fill_with_file(small_fs / "filler")
    taken = [await q.get() for _ in range(10)]
    assert taken == stored[:10]
    with caplog.at_level(logging.ERROR, logger="aiodiskqueue"):
        await asyncio.wait_for(asyncio.shield(q.aclose()), 10)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("closed without storing the last state" in m for m in errors)
    assert len(errors) <= 3  # one line per distinct error, not a stream
    os.remove(small_fs / "filler")
    async with DiskQueue(small_fs, "q", **OPTS) as q:
        got = await drain(q)
    # The taken ones may come again (the meta past them was never stored); nothing is lost.
    assert got == stored[len(stored) - len(got):] and len(got) >= len(stored) - 10


@pytest.mark.parametrize("spare", [True, False], ids=["meta-stored", "meta-fails-too"])
async def test_sync_reports_a_write_failure_once(small_fs: Path, spare: bool) -> None:
    q = await DiskQueue.open(small_fs, "q", **OPTS)
    try:
        await q.put_many([b"first", b"second"])
        await q.sync()  # the meta is stored, and with it the spare allocated
        assert await q.get() == b"first"  # so the next sync has a new meta to store
        if not spare:
            os.remove(small_fs / SPARE)
        fill_with_file(small_fs / "filler")
        for i in range(20):
            q.put_nowait(msg(i) * 8)  # more than the free part of the page "first" is in
        with pytest.raises(DiskQueueError) as ei:
            await q.sync()
        assert "20 message(s)" in str(ei.value)
        assert ("sync of" in str(ei.value)) is not spare
        os.remove(small_fs / "filler")
        await q.put(b"after")
        await q.sync()  # nothing failed since the last report
        assert await drain(q) == [b"second", b"after"]
    finally:
        await q.aclose()


class _ReadOnly:
    """``os`` calls that fail with EROFS while ``on``, as on a filesystem the kernel
    remounted read-only after an error. The real thing, an ext4 the kernel remounts
    read-only, is tested below; this simulation covers the pure-Python write path."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        real_open = os.open
        for name in ("pwrite", "write", "ftruncate", "fdatasync", "fsync", "rename",
                     "replace", "remove"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self._wrap(real))

        def fake_open(path: str, flags: int, *args: object) -> int:
            if self.on and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            return real_open(path, flags, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", fake_open)

    def _wrap(self, real: object) -> object:
        def call(*args: object, **kw: object) -> object:
            if self.on:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))
            return real(*args, **kw)  # type: ignore[operator]
        return call


@pytest.mark.usefixtures("pure_python")
async def test_read_only_filesystem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ro = _ReadOnly(monkeypatch)
    q = await DiskQueue.open(tmp_path, "q", **OPTS)
    try:
        await q.put_many([b"a", b"b"])
        await q.sync()
        ro.on = True
        for _ in range(2):
            with pytest.raises(DiskQueueError, match="Read-only file system") as ei:
                await q.put(b"c")
            assert "broken" not in str(ei.value)  # each put fails; none breaks the queue
        # What is stored stays readable.
        assert [await q.get(), await q.get()] == [b"a", b"b"]
        with pytest.raises(DiskQueueError, match="Read-only file system"):
            await q.sync()  # the meta past a and b cannot be stored
    finally:
        await asyncio.wait_for(asyncio.shield(q.aclose()), 10)
    ro.on = False
    async with DiskQueue(tmp_path, "q", **OPTS) as q:
        # The meta past a and b was never stored: they come again, nothing else.
        assert await drain(q) == [b"a", b"b"]
        await q.put(b"d")
        assert await q.get() == b"d"


async def _ack_fill_and_finish(mnt: Path, n: int) -> tuple[list[bytes], list[bytes]]:
    q = await AckQueue.open(mnt, "q", **OPTS)
    stored = await fill(q)
    finished = []
    for _ in range(n):
        m = await asyncio.wait_for(q.get(), 10)
        await m.finish()
        finished.append(m.body)
    await asyncio.wait_for(asyncio.shield(q.aclose()), 10)
    return stored, finished


async def test_ack_queue_close_on_a_full_disk_returns(small_fs: Path) -> None:
    stored, finished = await _ack_fill_and_finish(small_fs, 10)  # closes within 10 s
    assert len(stored) > 500 and finished == stored[:10]


async def test_ack_queue_on_a_full_disk_closes_and_loses_nothing(small_fs: Path) -> None:
    stored, finished = await _ack_fill_and_finish(small_fs, 10)
    q = await AckQueue.open(small_fs, "q", **OPTS)
    try:
        got = []
        while q.qsize():
            m = await asyncio.wait_for(q.get(), 10)
            got.append(m.body)
            await m.finish()  # in memory: the ack log cannot grow on this full disk
        # Every message not acknowledged comes again, in order.
        rest = [b for b in stored if b not in finished]
        assert [b for b in got if b in rest] == rest
    finally:
        await asyncio.wait_for(asyncio.shield(q.aclose()), 10)


async def test_ack_queue_drain_of_a_full_disk_frees_space(small_fs: Path) -> None:
    await _ack_fill_and_finish(small_fs, 10)
    async with AckQueue(small_fs, "q", **OPTS) as q:
        while q.qsize():
            m = await asyncio.wait_for(q.get(), 10)
            await m.finish()
        await q.sync()
        assert free_bytes(small_fs) > 500 * 1024
        await q.put(b"again")
        m = await asyncio.wait_for(q.get(), 10)
        assert m.body == b"again"
        await m.finish()


# ---------------------------------------------------------------------- a real EROFS


@pytest.fixture
def ext4_fs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A loop-mounted 8 MiB ext4 with ``errors=remount-ro``; yields (mount point, its
    ``trigger_fs_error`` file: writing 1 makes the kernel remount it read-only, with the
    queue's files open, as after a disk error)."""
    image, mnt = tmp_path / "fs.ext4", tmp_path / "ext4"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(8 * 2**20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True,
                          check=False) if os.access("/usr/sbin/mkfs.ext4", os.X_OK) else None
    r = _mount_image(image, mnt) if made is not None and made.returncode == 0 else None
    if r is None or r.returncode != 0:
        why = (f"cannot make and loop-mount an ext4 image on {mnt} "
               f"({'' if r is None else r.stderr.decode(errors='replace').strip()}); "
               "the read-only tests need root, mkfs.ext4 and a loop device "
               "(set AIODISKQUEUE_NO_MOUNT=1 to skip them)")
        if os.environ.get("AIODISKQUEUE_NO_MOUNT") == "1":
            pytest.skip(why)
        pytest.fail(why)
    try:
        yield mnt, _trigger_path(mnt)
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def _mount_image(image: Path, mnt: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(image), str(mnt)],
                          capture_output=True, check=False)


def _trigger_path(mnt: Path) -> Path:
    with open("/proc/mounts") as f:
        dev = next(line.split()[0] for line in f if line.split()[1] == str(mnt))
    trigger = Path("/sys/fs/ext4") / os.path.basename(dev) / "trigger_fs_error"
    if not trigger.exists():
        pytest.fail(f"{trigger} is missing: this kernel cannot make ext4 read-only on demand")
    return trigger


def _remount_writable(mnt: Path) -> None:
    """Unmount the failed filesystem, check it, mount it writable again."""
    with open("/proc/mounts") as f:
        dev = next(line.split()[0] for line in f if line.split()[1] == str(mnt))
    image = Path(subprocess.run(["losetup", "-n", "-O", "BACK-FILE", dev], capture_output=True,
                                check=True, text=True).stdout.strip())
    subprocess.run(["umount", str(mnt)], check=True, capture_output=True)
    subprocess.run(["e2fsck", "-fy", str(image)], capture_output=True, check=False)
    assert _mount_image(image, mnt).returncode == 0


async def test_a_real_read_only_remount_fails_puts_keeps_data_and_closes(
        ext4_fs: tuple[Path, Path]) -> None:
    mnt, trigger = ext4_fs
    q = await DiskQueue.open(mnt, "q", **OPTS)
    try:
        await q.put_many([b"a", b"b"])
        await q.sync()
        trigger.write_text("1")
        with pytest.raises(DiskQueueError, match="Read-only file system") as ei:
            await q.put(b"c")
        cause = ei.value.__cause__
        assert isinstance(cause, OSError) and cause.errno == errno.EROFS
        assert "broken" not in str(ei.value)
        assert [await asyncio.wait_for(q.get(), 10) for _ in range(2)] == [b"a", b"b"]
    finally:
        await asyncio.wait_for(asyncio.shield(q.aclose()), 10)
    _remount_writable(mnt)
    async with DiskQueue(mnt, "q", **OPTS) as q:
        # The meta past a and b could not be stored: they come again; c never was stored.
        assert await drain(q) == [b"a", b"b"]
        await q.put(b"d")
        assert await q.get() == b"d"


async def test_an_ack_queue_on_a_real_read_only_remount_closes_and_loses_nothing(
        ext4_fs: tuple[Path, Path]) -> None:
    mnt, trigger = ext4_fs
    q = await AckQueue.open(mnt, "q", **OPTS)
    try:
        await q.put_many([msg(i) for i in range(10)])
        for _ in range(3):
            m = await asyncio.wait_for(q.get(), 10)
            await m.finish()
        await q.sync()  # the three finishes are durable
        trigger.write_text("1")
        with pytest.raises(DiskQueueError, match="Read-only file system"):
            await q.put(b"late")
        m = await asyncio.wait_for(q.get(), 10)
        assert m.body == msg(3)
        await m.finish()  # in memory only: the log cannot be written
    finally:
        await asyncio.wait_for(asyncio.shield(q.aclose()), 10)
    _remount_writable(mnt)
    async with AckQueue(mnt, "q", **OPTS) as q:
        got = []
        while q.qsize():
            m = await asyncio.wait_for(q.get(), 10)
            got.append(m.body)
            await m.finish()
        # Every message not durably finished comes again, in order.
        assert got == [msg(i) for i in range(3, 10)]

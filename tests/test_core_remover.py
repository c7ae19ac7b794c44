"""Removing a consumed segment: freed in committed steps when nothing else holds it open,
left whole for any other open file (another process's reader keeps reading it)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import aiodiskqueue._core.remover as remover
from aiodiskqueue import DiskQueue

MiB = 1 << 20


def _segment(tmp_path: Path, size: int = 20 * MiB) -> tuple[Path, bytes]:
    path = tmp_path / "q.diskqueue.000000.dat"
    data = os.urandom(MiB) * (size // MiB)
    path.write_bytes(data)
    return path, data


@pytest.fixture
def truncations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes the remover truncates files to, in order (not the meta store's)."""
    sizes: list[int] = []
    real: Callable[[int, int], None] = os.ftruncate

    def spy(fd: int, size: int) -> None:
        if sys._getframe(1).f_code is remover._free_in_steps.__code__:
            sizes.append(size)
        real(fd, size)

    monkeypatch.setattr(os, "ftruncate", spy)
    return sizes


def test_a_segment_nobody_else_holds_is_freed_in_steps(
        tmp_path: Path, truncations: list[int]) -> None:
    path, _ = _segment(tmp_path)
    remover._remove(str(path), True)
    assert not path.exists()
    assert truncations == _steps(20 * MiB)
    assert len(truncations) == 3  # 20 MiB in 8 MiB steps


def test_a_segment_open_in_this_process_is_only_unlinked(
        tmp_path: Path, truncations: list[int]) -> None:
    path, data = _segment(tmp_path)
    with open(path, "rb") as reader:
        reader.read(100)
        remover._remove(str(path), True)
        assert not path.exists()
        assert truncations == []
        assert reader.read() == data[100:]  # the reader still has every byte


@contextlib.contextmanager
def _reader_in_another_process(path: Path, opens: str) -> Iterator[Callable[[], str]]:
    """A child process that runs ``opens`` (which leaves ``fd`` open on ``path``) and,
    when the function it yields is called, returns the sha256 of what it reads there."""
    code = ("import fcntl, hashlib, os, signal, sys\n" + opens
            + "print('ready', flush=True)\nsys.stdin.readline()\n"
              "print(hashlib.sha256(os.pread(fd, 1 << 25, 0)).hexdigest(), flush=True)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    stdin, stdout = child.stdin, child.stdout
    assert stdin is not None and stdout is not None
    try:
        assert stdout.readline().strip() == "ready"

        def read_all() -> str:
            stdin.write("go\n")
            stdin.flush()
            return stdout.readline().strip()

        yield read_all
    finally:
        child.kill()
        child.wait()


def test_a_segment_open_in_another_process_is_only_unlinked(
        tmp_path: Path, truncations: list[int]) -> None:
    path, data = _segment(tmp_path, 10 * MiB)
    with _reader_in_another_process(path, "fd = os.open(sys.argv[1], os.O_RDONLY)\n") as read:
        remover._remove(str(path), True)
        assert not path.exists() and truncations == []
        assert read() == hashlib.sha256(data).hexdigest()


def test_a_segment_under_another_process_s_read_lease_is_unlinked_without_waiting(
        tmp_path: Path, truncations: list[int]) -> None:
    # A file server holds read leases on what its clients read; opening the file for
    # writing would wait until the lease is broken (45 s by default). The remover's
    # open does not wait: the segment is only unlinked.
    path, data = _segment(tmp_path, MiB)
    leased = ("fd = os.open(sys.argv[1], os.O_RDONLY)\n"
              "fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)\n"
              "fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)\n")
    with _reader_in_another_process(path, leased) as read:
        worker = threading.Thread(target=remover._remove, args=(str(path), True))
        worker.start()
        worker.join(20)  # a blocking open would hold it for the lease break time
        assert not worker.is_alive(), "the removal waited for the other process's lease"
        assert not path.exists() and truncations == []
        assert read() == hashlib.sha256(data).hexdigest()


def test_an_open_during_the_steps_stops_them(
        tmp_path: Path, truncations: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    # An open that reaches the file while the steps run (its name looked up just before
    # the unlink; here through /proc) breaks the lease: it waits for the step in
    # progress, and no further step is taken.
    path, _ = _segment(tmp_path, 20 * MiB)
    opened: list[int] = []
    opener: list[threading.Thread] = []
    real_sync: Callable[[int], None] = os.fdatasync

    def sync_then_open(fd: int) -> None:
        real_sync(fd)
        if sys._getframe(1).f_code is not remover._free_in_steps.__code__ or opener:
            return
        t = threading.Thread(target=lambda: opened.append(
            os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)))
        opener.append(t)
        t.start()
        for _ in range(500):  # until the kernel has started to break the lease
            if fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_WRLCK:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the open did not break the lease")
        assert not opened  # it waits for the lease

    monkeypatch.setattr(os, "fdatasync", sync_then_open)
    remover._remove(str(path), True)
    opener[0].join(10)
    assert not path.exists()
    assert truncations == [20 * MiB - remover.STEP_BYTES]  # one step, then it stopped
    try:
        assert os.fstat(opened[0]).st_size == 20 * MiB - remover.STEP_BYTES
    finally:
        os.close(opened[0])


def test_without_leases_a_segment_is_only_unlinked(
        tmp_path: Path, truncations: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remover, "_SETLEASE", None)
    path, _ = _segment(tmp_path, MiB)
    remover._remove(str(path), True)
    assert not path.exists() and truncations == []
    remover._remove(str(path), True)  # gone already: nothing to do, nothing raised


def _steps(size: int) -> list[int]:
    out = []
    while size > 0:
        size = max(0, size - remover.STEP_BYTES)
        out.append(size)
    return out


async def test_a_drained_queue_frees_its_consumed_segments_in_steps(
        tmp_path: Path, truncations: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remover, "frees_in_steps", lambda path: True)  # as on `discard`
    q = await DiskQueue.open(tmp_path, "q", max_bytes_per_file=10 * MiB, sync_every=100)
    payload = os.urandom(1020)
    for _ in range(25):
        await q.put_many([payload] * 1024)  # 25 MiB: three segments
    sizes = [(tmp_path / f"q.diskqueue.{n:06d}.dat").stat().st_size for n in (0, 1)]
    for _ in range(25 * 1024):
        assert await q.get() == payload
    await q.sync()  # returns with the consumed segments gone
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".dat")
                   and ".meta." not in p.name)
    await q.aclose()
    assert names == ["q.diskqueue.000002.dat"]
    assert truncations == _steps(sizes[0]) + _steps(sizes[1])


def test_a_hard_link_keeps_every_byte(tmp_path: Path, truncations: list[int]) -> None:
    path, data = _segment(tmp_path, 10 * MiB)
    other = tmp_path / "kept.dat"
    os.link(path, other)
    remover._remove(str(path), True)
    assert not path.exists() and truncations == []
    assert other.read_bytes() == data


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict
30 27 254:16 / /data rw,noatime - ext4 /dev/vdb rw
31 27 0:40 / /b rw,relatime shared:1 - btrfs /dev/vdc rw,ssd,discard=async
32 27 8:1 / /x rw,discard master:2 - xfs /dev/sda1 rw
"""


@pytest.mark.parametrize(("dev", "expected"), [
    (os.makedev(254, 0), True),  # ext4 with discard among the superblock's options
    (os.makedev(254, 16), False),  # no discard
    (os.makedev(0, 40), False),  # discard=async trims off the commit
    (os.makedev(8, 1), True),  # discard among the mount's options, optional fields
    (os.makedev(9, 9), False),  # not mounted
])
def test_mount_discards_reads_the_mount_of_the_device(dev: int, expected: bool) -> None:
    assert remover.mount_discards(MOUNTINFO, dev) is expected


def test_steps_need_leases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remover, "_SETLEASE", None)
    assert not remover.frees_in_steps(str(tmp_path / "q.diskqueue.000000.dat"))


def test_a_backlog_is_removed_without_steps(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remover, "frees_in_steps", lambda path: True)
    rm = remover.SegmentRemover("q")
    rm._queued = 1 + remover.STEP_BACKLOG  # this removal and the backlog allowed
    assert rm._in_steps("x")
    rm._queued = 2 + remover.STEP_BACKLOG  # one more waits behind it (a purge)
    assert not rm._in_steps("x")


def test_the_remover_survives_an_unexpected_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def broken(path: str, steps: bool) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise RuntimeError("boom")
        os.remove(path)

    monkeypatch.setattr(remover, "_remove", broken)
    rm = remover.SegmentRemover("q")
    paths = [tmp_path / f"{n}.dat" for n in range(2)]
    for p in paths:
        p.write_bytes(b"x")
        rm.remove(str(p))
    closer = threading.Thread(target=rm.close)
    closer.start()
    closer.join(10)
    assert not closer.is_alive(), "close() waits for a removal the dead thread never did"
    assert calls == [str(p) for p in paths]
    assert paths[0].exists() and not paths[1].exists()

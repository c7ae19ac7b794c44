"""The meta file's store and load: atomic, durable, with a spare that keeps stores
working on a full disk (the full-disk cases themselves are in test_full_disk.py)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from aiodiskqueue._format import meta as meta_module
from aiodiskqueue._format.meta import Meta, load_meta, spare_path, store_meta


def metas(n: int) -> list[Meta]:
    """States whose encodings differ in length, so a read of a file half rewritten
    (new bytes over the tail of longer old ones) would show."""
    return [Meta(i * 7919 % 100_000, 3, i, 5 + i % 3, 10 ** (i % 9)) for i in range(n)]


def test_a_store_keeps_the_old_meta_file_as_the_next_spare(tmp_path: Path) -> None:
    path = str(tmp_path / "q.diskqueue.meta.dat")
    store_meta(path, Meta(1, 0, 0, 0, 10))
    first = os.stat(path).st_ino
    store_meta(path, Meta(2, 0, 0, 0, 20))
    assert load_meta(path) == Meta(2, 0, 0, 0, 20)
    # Swapped, not freed: the spare is the old meta file, content and all (a new
    # spare would be zeros).
    assert os.stat(spare_path(path)).st_ino == first
    with open(spare_path(path), "rb") as f:
        assert f.read() == Meta(1, 0, 0, 0, 10).encode()
    assert sorted(os.listdir(tmp_path)) == ["q.diskqueue.meta.dat", "q.diskqueue.meta.dat.0.tmp"]


def test_a_store_without_a_spare_keeps_the_old_meta_file_as_one(tmp_path: Path) -> None:
    path = str(tmp_path / "q.diskqueue.meta.dat")
    store_meta(path, Meta(1, 0, 0, 0, 10))
    os.remove(spare_path(path))
    store_meta(path, Meta(2, 0, 0, 0, 20))
    assert load_meta(path) == Meta(2, 0, 0, 0, 20)
    with open(spare_path(path), "rb") as f:
        assert f.read() == Meta(1, 0, 0, 0, 10).encode()  # not a newly allocated spare
    assert sorted(os.listdir(tmp_path)) == ["q.diskqueue.meta.dat", "q.diskqueue.meta.dat.0.tmp"]


def test_where_names_cannot_be_swapped_the_meta_is_renamed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meta_module, "exchange_paths", lambda a, b: False)
    path = str(tmp_path / "q.diskqueue.meta.dat")
    for m in metas(5):
        store_meta(path, m)
        assert load_meta(path) == m
    assert os.path.getsize(spare_path(path)) == meta_module.SPARE_SIZE  # allocated anew
    assert sorted(os.listdir(tmp_path)) == ["q.diskqueue.meta.dat", "q.diskqueue.meta.dat.0.tmp"]


def test_loads_beside_a_live_store_see_only_stored_states(small_fs: Path) -> None:
    """A reader (the Spark source, the CLI) loads the meta of a queue that keeps
    storing it: every load is one of the stored states, never a mix, never an error.

    On a tmpfs, where a store's fsyncs cost nothing, a plain open-and-read sees
    hundreds of half-rewritten files in a run like this one.
    """
    path = str(small_fs / "q.diskqueue.meta.dat")
    states = metas(1000)
    store_meta(path, states[0])
    stop = threading.Event()
    stores = 0

    def writer() -> None:
        nonlocal stores
        while not stop.is_set():
            store_meta(path, states[stores % len(states)])
            stores += 1

    t = threading.Thread(target=writer)
    t.start()
    seen: set[Meta] = set()
    try:
        for _ in range(5000):
            m = load_meta(path)
            assert m is not None
            seen.add(m)
    finally:
        stop.set()
        t.join()
    assert seen <= set(states)
    assert stores > 100 and len(seen) > 10  # the loads really ran beside the stores


@pytest.fixture
def native() -> Any:
    """The native module (its ``swap_file``); these tests skip where it is not built."""
    return pytest.importorskip("aiodiskqueue._core._writer", reason="not built here")


def test_the_native_swap_stores_as_the_portable_steps_do(tmp_path: Path, native: Any) -> None:
    path = str(tmp_path / "q.diskqueue.meta.dat")
    store_meta(path, Meta(1, 0, 0, 0, 10))  # the first store makes the spare
    calls: list[int] = []

    def swap(directory: bytes, spare: bytes, name: bytes, data: bytes) -> int:
        calls.append(native.swap_file(directory, spare, name, data))
        return calls[-1]

    inodes = {os.stat(path).st_ino, os.stat(spare_path(path)).st_ino}
    for m in metas(6):
        store_meta(path, m, swap)
        assert load_meta(path) == m
    assert calls == [0] * 6  # the native common case, every time
    # Swapped, not freed: the same two files take turns (the spare holds the state before).
    assert {os.stat(path).st_ino, os.stat(spare_path(path)).st_ino} == inodes
    with open(spare_path(path), "rb") as f:
        assert f.read() == metas(6)[4].encode()
    assert sorted(os.listdir(tmp_path)) == ["q.diskqueue.meta.dat", "q.diskqueue.meta.dat.0.tmp"]


def test_where_the_native_swap_fails_the_portable_steps_store_the_meta(
        tmp_path: Path, native: Any) -> None:
    path = str(tmp_path / "q.diskqueue.meta.dat")
    d, spare, name = (os.fsencode(p) for p in (tmp_path, "q.diskqueue.meta.dat.0.tmp",
                                                "q.diskqueue.meta.dat"))
    # No spare and no meta file yet: the native call reports ENOENT and changes nothing.
    assert native.swap_file(d, spare, name, b"x") == errno.ENOENT
    assert os.listdir(tmp_path) == []
    store_meta(path, Meta(1, 0, 0, 0, 10), native.swap_file)  # the portable steps
    assert load_meta(path) == Meta(1, 0, 0, 0, 10)
    os.remove(spare_path(path))
    store_meta(path, Meta(2, 0, 0, 0, 20), native.swap_file)  # no spare: portable again
    assert load_meta(path) == Meta(2, 0, 0, 0, 20)
    # A swap that fails after any step: the portable steps redo all of it.
    store_meta(path, Meta(3, 0, 0, 0, 30), lambda *a: errno.EIO)
    assert load_meta(path) == Meta(3, 0, 0, 0, 30)
    store_meta(path, Meta(4, 0, 0, 0, 40),
               lambda *a: native.swap_file(*a) or errno.EIO)  # swapped, then "failed"
    assert load_meta(path) == Meta(4, 0, 0, 0, 40)
    assert sorted(os.listdir(tmp_path)) == ["q.diskqueue.meta.dat", "q.diskqueue.meta.dat.0.tmp"]


def test_a_native_swap_that_cannot_write_changes_nothing(tmp_path: Path, native: Any) -> None:
    path = str(tmp_path / "q.diskqueue.meta.dat")
    store_meta(path, Meta(1, 0, 0, 0, 10))
    os.remove(spare_path(path))
    os.mkdir(spare_path(path))  # not a file it can write
    d = os.fsencode(tmp_path)
    err = native.swap_file(d, b"q.diskqueue.meta.dat.0.tmp", b"q.diskqueue.meta.dat", b"2\n")
    assert err == errno.EISDIR
    assert load_meta(path) == Meta(1, 0, 0, 0, 10)  # nothing swapped
    assert native.swap_file(d + b"/missing", b"a", b"b", b"") == errno.ENOENT

"""The meta file's store and load: atomic, durable, with a spare that keeps stores
working on a full disk (the full-disk cases themselves are in test_full_disk.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

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
    assert os.stat(spare_path(path)).st_ino == first  # swapped, not freed
    assert sorted(os.listdir(tmp_path)) == ["q.diskqueue.meta.dat", "q.diskqueue.meta.dat.0.tmp"]


def test_a_store_without_a_spare_keeps_the_old_meta_file_as_one(tmp_path: Path) -> None:
    path = str(tmp_path / "q.diskqueue.meta.dat")
    store_meta(path, Meta(1, 0, 0, 0, 10))
    os.remove(spare_path(path))
    store_meta(path, Meta(2, 0, 0, 0, 20))
    assert load_meta(path) == Meta(2, 0, 0, 0, 20)
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
    states = metas(3000)
    store_meta(path, states[0])
    done = threading.Event()

    def writer() -> None:
        try:
            for m in states[1:]:
                store_meta(path, m)
        finally:
            done.set()

    t = threading.Thread(target=writer)
    t.start()
    seen, loads = set(), 0
    try:
        while not done.is_set():
            m = load_meta(path)
            assert m is not None
            seen.add(m)
            loads += 1
    finally:
        t.join()
    assert seen <= set(states)
    assert loads > 100 and len(seen) > 10  # the reads really ran beside the stores
    assert load_meta(path) == states[-1]

"""Interop with queues written by go-diskqueue, and queues we write read by an
independent reader (``helpers_format``) that follows the fixtures README."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import CopyFixture
from helpers_format import (
    bad_files,
    fixture_msg,
    layout,
    multi_msg,
    oversize_msg,
    read_meta,
    read_queue,
    seg_name,
    segment_numbers,
    write_queue,
)

from aiodiskqueue import DiskQueue


@dataclass(frozen=True)
class Fixture:
    """One fixture queue as the README documents it."""

    name: str
    gen: Callable[[int], bytes]
    written: int
    consumed: int
    max_bytes: int
    max_msg: int
    meta_text: bytes
    files: tuple[int, ...]
    emptied: bool = False

    def remaining(self) -> list[bytes]:
        """The messages the queue must still deliver."""
        if self.emptied:
            return []
        return [self.gen(i) for i in range(self.consumed, self.written)]


FIXTURES = [
    Fixture("fixture", fixture_msg, 1000, 137, 1024, 1 << 20, b"863\n5,0\n38,531\n",
            tuple(range(5, 39))),
    Fixture("partial", fixture_msg, 1000, 150, 1024, 1 << 20, b"850\n5,741\n38,531\n",
            tuple(range(5, 39))),
    Fixture("empty", fixture_msg, 100, 100, 1024, 1 << 20, b"0\n3,840\n3,840\n", (3,)),
    Fixture("multi", multi_msg, 2002, 0, 65536, 1 << 20, b"2002\n0,0\n78,29949\n",
            tuple(range(79))),
    Fixture("oversize", oversize_msg, 9, 0, 100, 1000, b"9\n0,0\n6,5\n", tuple(range(7))),
    Fixture("emptied", fixture_msg, 100, 0, 1024, 1 << 20, b"0\n4,0\n4,0\n", (),
            emptied=True),
]
IDS = [f.name for f in FIXTURES]


def _extra(fx: Fixture) -> list[bytes]:
    """New messages to put after the fixture's: more of the same generator, where it has room."""
    if fx.gen is oversize_msg:
        return [bytes([i]) * n for i, n in enumerate([96, 0, 300, 10, 86, 1000])]
    return [fx.gen(i) for i in range(fx.written, fx.written + 150)]


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
def test_fixture_copy_is_intact_and_oracle_reads_it(fixtures_dir: Path, copy_fixture: CopyFixture,
                                                    tmp_path: Path, fx: Fixture) -> None:
    manifest = json.loads((fixtures_dir / "manifest.json").read_text())[fx.name]
    copied = copy_fixture(fx.name, tmp_path)
    assert {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in copied} == {k: (v["size"], v["sha256"])
                                 for k, v in manifest["files"].items()}
    assert manifest["meta_text"].encode() == fx.meta_text
    assert (manifest["maxBytesPerFile"], manifest["maxMsgSize"]) == (fx.max_bytes, fx.max_msg)
    assert tuple(segment_numbers(tmp_path, fx.name)) == fx.files
    assert read_meta(tmp_path, fx.name).encode() == fx.meta_text
    assert read_queue(tmp_path, fx.name) == fx.remaining()


@pytest.mark.parametrize("fx", [f for f in FIXTURES if not f.emptied],
                         ids=[f.name for f in FIXTURES if not f.emptied])
def test_oracle_writer_rebuilds_fixture_bytes(fixtures_dir: Path, tmp_path: Path,
                                              fx: Fixture) -> None:
    msgs = [fx.gen(i) for i in range(fx.written)]
    write_queue(tmp_path, fx.name, msgs, fx.max_bytes, consumed=fx.consumed)
    for num in fx.files:
        name = seg_name(fx.name, num)
        assert (tmp_path / name).read_bytes() == (fixtures_dir / name).read_bytes(), name
    assert tuple(segment_numbers(tmp_path, fx.name)) == fx.files
    assert read_meta(tmp_path, fx.name).encode() == fx.meta_text


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
async def test_fixture_delivers_documented_messages(copy_fixture: CopyFixture, tmp_path: Path,
                                                    fx: Fixture) -> None:
    copy_fixture(fx.name, tmp_path)
    expected = fx.remaining()
    async with DiskQueue(tmp_path, fx.name, max_bytes_per_file=fx.max_bytes,
                         max_msg_size=fx.max_msg) as q:
        st = q.statistics()
        meta = read_meta(tmp_path, fx.name)
        assert (st.read_file_num, st.read_pos) == (meta.read_file, meta.read_pos)
        assert (st.write_file_num, st.write_pos) == (meta.write_file, meta.write_pos)
        assert q.qsize() == len(expected) == meta.depth
        got = [await q.get() for _ in range(len(expected))]
        assert got == expected
        assert q.qsize() == 0 and q.statistics().bad_files == 0
    assert bad_files(tmp_path) == []
    m = read_meta(tmp_path, fx.name)
    assert m.depth == 0 and (m.read_file, m.read_pos) == (m.write_file, m.write_pos)
    # Fully read files are deleted; only the write file (if any) remains.
    assert segment_numbers(tmp_path, fx.name) in ([], [m.write_file])


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
async def test_fixture_appends_in_go_format(fixtures_dir: Path, copy_fixture: CopyFixture,
                                            tmp_path: Path, fx: Fixture) -> None:
    copy_fixture(fx.name, tmp_path)
    before = read_meta(tmp_path, fx.name)
    extra = _extra(fx)
    async with DiskQueue(tmp_path, fx.name, max_bytes_per_file=fx.max_bytes,
                         max_msg_size=fx.max_msg) as q:
        for m in extra:
            await q.put(m)
        await q.sync()
        appended, (wf, wp) = layout(extra, fx.max_bytes, before.write_file, before.write_pos)
        for num, data in appended.items():
            src = fixtures_dir / seg_name(fx.name, num)
            old = src.read_bytes()[: before.write_pos] if num == before.write_file and \
                src.exists() else b""
            assert (tmp_path / seg_name(fx.name, num)).read_bytes() == old + data, num
        meta = read_meta(tmp_path, fx.name)
        assert (meta.write_file, meta.write_pos) == (wf, wp)
        assert (meta.read_file, meta.read_pos) == (before.read_file, before.read_pos)
        # The independent reader sees the old queue followed by the new messages.
        assert read_queue(tmp_path, fx.name) == fx.remaining() + extra
        total = len(fx.remaining()) + len(extra)
        assert [await q.get() for _ in range(total)] == fx.remaining() + extra
    assert read_queue(tmp_path, fx.name) == []
    assert bad_files(tmp_path) == []


def _random_msgs(rng: random.Random, n: int, max_len: int) -> list[bytes]:
    return [rng.randbytes(rng.choice([0, 1, rng.randrange(max_len + 1), max_len]))
            for _ in range(n)]


@pytest.mark.parametrize("seed", range(6), ids=lambda s: f"seed{s}")
async def test_our_queue_read_by_independent_reader(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    max_bytes = rng.choice([16, 100, 1024, 4096])
    msgs = _random_msgs(rng, rng.randrange(50, 400), rng.choice([8, 64, 300, 2000]))
    consumed = rng.randrange(len(msgs))
    async with DiskQueue(tmp_path, "ours", max_bytes_per_file=max_bytes) as q:
        i = 0
        while i < len(msgs):  # mix single puts and batches
            k = rng.randrange(1, 20)
            if k < 5:
                for m in msgs[i:i + k]:
                    await q.put(m)
            else:
                await q.put_many(msgs[i:i + k])
            i += k
        assert [await q.get() for _ in range(consumed)] == msgs[:consumed]
    # Same bytes as the format's writer produces, file by file, for the unread files.
    files, (wf, wp) = layout(msgs, max_bytes)
    meta = read_meta(tmp_path, "ours")
    assert (meta.write_file, meta.write_pos) == (wf, wp)
    assert meta.depth == len(msgs) - consumed
    for num in segment_numbers(tmp_path, "ours"):
        assert (tmp_path / seg_name("ours", num)).read_bytes() == files[num], num
    assert segment_numbers(tmp_path, "ours") == list(range(meta.read_file, wf + 1)) or (
        wp == 0 and segment_numbers(tmp_path, "ours") == list(range(meta.read_file, wf)))
    assert read_queue(tmp_path, "ours") == msgs[consumed:]


@pytest.mark.parametrize("seed", range(4), ids=lambda s: f"seed{s}")
async def test_queue_written_by_oracle_read_by_us(tmp_path: Path, seed: int) -> None:
    rng = random.Random(100 + seed)
    max_bytes = rng.choice([20, 128, 1000])
    msgs = _random_msgs(rng, rng.randrange(20, 300), 200)
    consumed = rng.randrange(len(msgs))
    write_queue(tmp_path, "theirs", msgs, max_bytes, consumed=consumed)
    async with DiskQueue(tmp_path, "theirs", max_bytes_per_file=max_bytes) as q:
        assert q.qsize() == len(msgs) - consumed
        assert [await q.get() for _ in range(q.qsize())] == msgs[consumed:]
    assert bad_files(tmp_path) == []


def test_repository_fixtures_match_manifest(fixtures_dir: Path) -> None:
    """The fixtures shipped in ``tests/fixtures/go-diskqueue`` are exactly the manifest's
    files, byte for byte (size and sha256), plus the README and the manifest itself."""
    manifest = json.loads((fixtures_dir / "manifest.json").read_text())
    expected = {name: (f["size"], f["sha256"])
                for queue in manifest.values() for name, f in queue["files"].items()}
    present = {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
               for p in fixtures_dir.iterdir() if p.name not in ("README.md", "manifest.json")}
    assert present == expected

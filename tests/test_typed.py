"""``aiodiskqueue.typed``: serializers over the byte queue, errors before storing and on reading."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import struct
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aiodiskqueue import DiskQueue, DiskQueueError, QueueEmpty
from aiodiskqueue.serializers import (
    DeserializationError,
    JsonSerializer,
    MissingExtra,
    MsgpackSerializer,
    PickleSerializer,
    SerializationError,
)
from aiodiskqueue.sync import DiskQueue as SyncDiskQueue
from aiodiskqueue.sync import Empty
from aiodiskqueue.typed import SyncTypedQueue, TypedQueue


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


JSON: list[Any] = [{"a": 1, "b": [1, 2.5, None, True]}, "ünïcode", 7, [], None, {"": {"x": "y"}}]


@pytest.fixture
async def jq(tmp_path: Path) -> AsyncIterator[TypedQueue[Any]]:
    async with TypedQueue(DiskQueue(tmp_path, "j", max_bytes_per_file=64),
                          JsonSerializer[Any]()) as q:
        yield q


def record_at(path: str, offset: int) -> bytes:
    """The payload of the record whose length prefix is at ``offset`` of ``path``."""
    with open(path, "rb") as f:
        f.seek(offset)
        (n,) = struct.unpack(">I", f.read(4))
        return f.read(n)


# ---------------------------------------------------------------------- round trips


async def test_json_round_trip(jq: TypedQueue[Any]) -> None:
    for v in JSON:
        await jq.put(v)
    jq.put_nowait({"now": 1})
    await jq.put_many([[1], [2]])
    assert [await jq.get() for _ in JSON] == JSON
    assert await jq.get_many(10) in ([{"now": 1}, [1], [2]], [{"now": 1}])
    assert jq.statistics().puts == len(JSON) + 3


async def test_json_bytes_on_disk_are_compact_utf8(tmp_path: Path) -> None:
    async with await TypedQueue.open(tmp_path, "u", JsonSerializer[dict[str, str]]()) as q:
        await q.put({"k": "é"})
    data = (tmp_path / "u.diskqueue.000000.dat").read_bytes()
    assert data == struct.pack(">I", 10) + '{"k":"é"}'.encode()


async def test_pickle_round_trip(tmp_path: Path) -> None:
    async with await TypedQueue.open(tmp_path, "p", PickleSerializer[object]()) as q:
        values: list[object] = [Point(1, 2), (1, "a"), {1, 2}, b"raw", 3.5]
        await q.put_many(values)
        assert [await q.get() for _ in values] == values


async def test_msgpack_round_trip(tmp_path: Path) -> None:
    async with await TypedQueue.open(tmp_path, "m", MsgpackSerializer[Any]()) as q:
        values: list[Any] = [{"s": "str", "b": b"bytes", "n": [1, -2, 3.5, None]}, 2**40, "x"]
        for v in values:
            await q.put(v)
        assert [await q.get() for _ in values] == values
        await q.put((1, 2))
        assert await q.get() == [1, 2]  # documented: tuples come back as lists


def test_missing_msgpack_raises_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "msgpack", None)
    with pytest.raises(MissingExtra, match=r'pip install "asyncio-diskqueue\[msgpack\]"'):
        MsgpackSerializer[Any]()
    assert issubclass(MissingExtra, DiskQueueError) and issubclass(MissingExtra, ImportError)


def test_pickle_protocol_is_checked() -> None:
    with pytest.raises(ValueError, match="protocol must be an int in"):
        PickleSerializer[Any](protocol=99)


# ------------------------------------------------------------------ values that cannot be stored


@pytest.mark.parametrize(("ser", "value", "reason"), [
    (JsonSerializer[Any](), float("nan"), "ValueError: Out of range float values"),
    (JsonSerializer[Any](), {1, 2}, "TypeError: Object of type set is not JSON serializable"),
    (PickleSerializer[Any](), lambda: 1, "PicklingError"),
    (MsgpackSerializer[Any](), object(), "TypeError: can not serialize 'object' object"),
], ids=["json-nan", "json-set", "pickle-lambda", "msgpack-object"])
async def test_unserializable_value_raises_before_storing(
        tmp_path: Path, ser: Any, value: object, reason: str) -> None:
    async with await TypedQueue.open(tmp_path, "s", ser) as q:
        with pytest.raises(SerializationError, match=reason) as info:
            await q.put(value)
        assert info.value.value is value
        assert isinstance(info.value.__cause__, Exception)
        with pytest.raises(SerializationError):
            q.put_nowait(value)
        with pytest.raises(SerializationError):
            await q.put_many([1, value])  # the good first item is not stored either
        st = q.statistics()
        assert (st.puts, st.depth, st.bytes_on_disk) == (0, 0, 0)


async def test_serializer_returning_str_raises(tmp_path: Path) -> None:
    class Bad:
        def dumps(self, value: str, /) -> bytes:
            return value  # type: ignore[return-value]

        def loads(self, data: bytes, /) -> str:
            return data.decode()

    async with await TypedQueue.open(tmp_path, "b", Bad()) as q:
        msg = re.escape("Bad.dumps returned str, not bytes")
        with pytest.raises(SerializationError, match=msg):
            await q.put("x")
        assert q.qsize() == 0


# ---------------------------------------------------------------------- records that cannot be read


async def fill_with_bad(q: TypedQueue[Any]) -> None:
    """good 0, good 1, BAD, good 2, good 3: 11- and 13-byte records, 64-byte files."""
    await q.put({"n": 0})
    await q.put({"n": 1})
    await q.queue.put(b"\xffnot json")  # written by someone else, bypassing the serializer
    await q.put({"n": 2})
    await q.put({"n": 3})


async def test_bad_record_names_file_and_offset_and_loses_nothing(jq: TypedQueue[Any]) -> None:
    await fill_with_bad(jq)
    assert await jq.get() == {"n": 0}
    assert await jq.get() == {"n": 1}
    with pytest.raises(DeserializationError) as info:
        await jq.get()
    err = info.value
    assert (err.queue, err.ordinal, err.payload) == ("j", 3, b"\xffnot json")
    # records of 4 + 7 bytes ({"n":0}) twice, then the bad one at byte 22 of file 0
    assert err.path == str(Path(jq.queue.directory) / "j.diskqueue.000000.dat")
    assert err.offset == 22
    assert record_at(err.path, err.offset) == b"\xffnot json"
    assert f"{err.path} at byte 22" in str(err) and "message #3 of queue 'j'" in str(err)
    assert isinstance(err.__cause__, UnicodeDecodeError)
    assert isinstance(err, DiskQueueError) and isinstance(err, ValueError)
    assert await jq.get() == {"n": 2}  # the next messages are kept
    assert await jq.get() == {"n": 3}
    assert jq.empty()


async def test_bad_record_in_a_later_file_after_reopen(tmp_path: Path) -> None:
    ser = JsonSerializer[Any]()
    async with TypedQueue(DiskQueue(tmp_path, "r", max_bytes_per_file=40), ser) as q:
        for i in range(4):
            await q.put(i)  # 5-byte records: 20 bytes of file 0
        await q.put("x" * 20)  # a 26-byte record does not fit: file 1 at 0
        # the bad record, 9 bytes, fits behind it in file 1 at byte 26
        await q.queue.put(b"{oops")
        await q.put(5)
        assert await q.get() == 0
    async with TypedQueue(DiskQueue(tmp_path, "r", max_bytes_per_file=40), ser) as q:
        assert [await q.get() for _ in range(4)] == [1, 2, 3, "x" * 20]
        where = re.escape("r.diskqueue.000001.dat at byte 26")
        with pytest.raises(DeserializationError, match=where) as info:
            await q.get()
        assert info.value.ordinal == 5  # fifth message this object handed out
        assert record_at(info.value.path, info.value.offset) == b"{oops"
        assert await q.get() == 5


async def test_get_many_returns_the_good_ones_then_raises(jq: TypedQueue[Any]) -> None:
    await fill_with_bad(jq)
    await jq.sync()
    got = await jq.get_many(10)
    assert got in ([{"n": 0}, {"n": 1}], [{"n": 0}])  # what was read ahead
    if len(got) == 1:
        assert await jq.get() == {"n": 1}
    with pytest.raises(DeserializationError, match="at byte 22"):
        await jq.get_many(10)  # raised by the next call, even though it was taken before
    rest = await jq.get_many(10)
    rest += [] if len(rest) == 2 else [await jq.get()]
    assert rest == [{"n": 2}, {"n": 3}]


async def test_get_nowait_raises_queue_empty_and_bad_records(jq: TypedQueue[Any]) -> None:
    with pytest.raises(QueueEmpty):
        jq.get_nowait()
    await jq.queue.put(b"nope")
    await jq.put(1)
    await jq.sync()
    while not jq.statistics().ready:  # wait for the read-ahead, done by the I/O thread
        await asyncio.sleep(0.001)
    with pytest.raises(DeserializationError, match="at byte 0"):
        jq.get_nowait()
    assert await jq.get() == 1


async def test_async_for_stops_at_a_bad_record_and_goes_on(jq: TypedQueue[Any]) -> None:
    await fill_with_bad(jq)
    jq.shutdown()
    seen: list[Any] = []

    async def collect() -> None:
        async for v in jq:
            seen.append(v)

    with pytest.raises(DeserializationError):
        await collect()
    async for v in jq:
        seen.append(v)
    assert seen == [{"n": i} for i in range(4)]


# ---------------------------------------------------------------------- from threads


def test_sync_typed_queue_from_threads(tmp_path: Path) -> None:
    with SyncTypedQueue(SyncDiskQueue(tmp_path, "st"), JsonSerializer[list[int]]()) as q:
        def produce(p: int) -> None:
            for k in range(100):
                q.put([p, k])

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        q.queue.put(b"[1,")
        q.put_many([[9, 0], [9, 1]])
        got = [q.get(timeout=10) for _ in range(800)]
        assert sorted(map(tuple, got)) == [(p, k) for p in range(8) for k in range(100)]
        where = re.escape("st.diskqueue.000000.dat at byte")
        with pytest.raises(DeserializationError, match=where) as info:
            q.get()
        assert record_at(info.value.path, info.value.offset) == b"[1,"
        assert q.get_many(5, timeout=10)[0] == [9, 0]
        with pytest.raises(SerializationError):
            q.put([1, float("inf")])  # type: ignore[list-item]
        if q.qsize():
            assert q.get() == [9, 1]
        with pytest.raises(Empty):
            q.get(timeout=0.01)
        with pytest.raises(Empty):
            q.get(block=False)
        assert q.empty() and len(q) == 0 and q.statistics().puts == 803

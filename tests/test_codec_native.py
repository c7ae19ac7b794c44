"""The native record splitter follows the codec's rule: ``split_records`` (C) and
``parse_py`` (Python) agree on every buffer, whole, truncated or corrupt."""

from __future__ import annotations

import struct

import pytest
from helpers_props import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from aiodiskqueue._format import codec

_writer = pytest.importorskip("aiodiskqueue._core._writer")
split_records = _writer.split_records


def native(buf: bytes, base: int, fnum: int, lo: int, hi: int, k: int = -1) -> codec.ParseResult:
    records, stop, bad = split_records(buf, base, fnum, lo, hi, k)
    return codec.ParseResult(records, stop, bad)


def same(a: codec.ParseResult, b: codec.ParseResult) -> None:
    assert (a.records, a.stop, a.bad_length) == (b.records, b.stop, b.bad_length)


payloads = st.lists(st.binary(max_size=300), max_size=20)


@settings(max_examples=examples(400), deadline=None)
@given(payloads, st.integers(0, 2**40), st.integers(0, 10**6), st.integers(0, 40),
       st.integers(0, 400), st.integers(-1, 25), st.data())
def test_c_and_python_agree_on_framed_buffers(ps: list[bytes], base: int, fnum: int, lo: int,
                                             hi: int, k: int, data: st.DataObject) -> None:
    buf = codec.frame(ps) if ps else b""
    cut = data.draw(st.integers(0, len(buf)), label="cut")  # a truncated tail
    for b in (buf, buf[:cut]):
        same(native(b, base, fnum, lo, hi, k), codec.parse_py(b, base, fnum, lo, hi, k))
        # Without positions: the same payloads, stop and bad length, from both.
        bare = split_records(b, base, fnum, lo, hi, -1, False)
        assert bare == codec.split_py(b, base, fnum, lo, hi, -1, False)
        whole = codec.parse_py(b, base, fnum, lo, hi)
        assert bare == ([r[0] for r in whole.records], whole.stop, whole.bad_length)


@settings(max_examples=examples(400), deadline=None)
@given(st.binary(max_size=600), st.integers(0, 1000), st.integers(0, 300), st.integers(0, 300))
def test_c_and_python_agree_on_random_bytes(buf: bytes, base: int, lo: int, hi: int) -> None:
    same(native(buf, base, 7, lo, hi), codec.parse_py(buf, base, 7, lo, hi))
    assert (split_records(buf, base, 7, lo, hi, -1, False)
            == codec.split_py(buf, base, 7, lo, hi, -1, False))


@settings(max_examples=examples(300), deadline=None)
@given(payloads, st.integers(0, 19), st.sampled_from([-2**31, -1, 2**31 - 1, 301, 1 << 24]),
       st.integers(0, 300))
def test_c_and_python_agree_on_a_corrupt_length(ps: list[bytes], at: int, bad: int,
                                               hi: int) -> None:
    # A length field overwritten with an out-of-range value (negative, oversize).
    ps = ps or [b"x"]
    recs = [struct.pack(">i", len(p)) + p for p in ps]
    i = at % len(recs)
    recs[i] = struct.pack(">i", bad) + recs[i][4:]
    buf = b"".join(recs)
    a = native(buf, 0, 1, 0, hi)
    same(a, codec.parse_py(buf, 0, 1, 0, hi))
    if hi < 2**31 - 1 or bad < 0:
        assert a.bad_length is not None or a.stop < len(buf)


@pytest.mark.parametrize(("buf", "lo", "hi", "want"), [
    # 4 + 3 bytes, then a length of 9 with 2 payload bytes: stops at 7, a torn tail.
    (struct.pack(">i", 3) + b"abc" + struct.pack(">i", 9) + b"de", 0, 100, ([b"abc"], 7, None)),
    # undersize: a 2-byte record with min_size 3 is a bad length at 0
    (struct.pack(">i", 2) + b"ab", 3, 100, ([], 0, 2)),
    # oversize: 5 > max_size 4
    (struct.pack(">i", 1) + b"a" + struct.pack(">i", 5) + b"abcde", 0, 4, ([b"a"], 5, 5)),
    # a negative length
    (struct.pack(">i", -7), 0, 100, ([], 0, -7)),
    # fewer than 4 bytes: nothing, no problem reported (the caller decides)
    (b"\x00\x00", 0, 100, ([], 0, None)),
])
def test_native_splitter_cases(buf: bytes, lo: int, hi: int,
                               want: tuple[list[bytes], int, int | None]) -> None:
    got = native(buf, 0, 2, lo, hi)
    assert ([r[0] for r in got.records], got.stop, got.bad_length) == want
    same(got, codec.parse_py(buf, 0, 2, lo, hi))


def test_native_splitter_refuses_a_negative_min_size() -> None:
    with pytest.raises(ValueError, match="min_size must be >= 0, got -1"):
        split_records(b"", 0, 0, -1, 10)


def test_parse_uses_the_installed_splitter() -> None:
    buf = codec.frame([b"a", b"bc"])
    calls: list[int] = []

    def spy(*args: object) -> tuple[list[tuple[bytes, int, int]], int, int | None]:
        calls.append(1)
        out: tuple[list[tuple[bytes, int, int]], int, int | None] = split_records(*args)
        return out

    before = codec._split
    codec.use_splitter(spy)
    try:
        res = codec.parse(buf, 0, 0, 0, 10)
    finally:
        codec.use_splitter(before)
    assert calls == [1]
    same(res, codec.parse_py(buf, 0, 0, 0, 10))


@pytest.mark.parametrize("splitter", [split_records, None], ids=["native", "python"])
def test_parse_payloads_gives_the_payloads_and_where_they_end(splitter: codec.Splitter | None
                                                               ) -> None:
    buf = codec.frame([b"a", b"bc", b""]) + struct.pack(">i", 9) + b"torn"
    before = codec._split
    codec.use_splitter(splitter)
    try:
        got = codec.parse_payloads(buf, 100, 0, 10)
        bad = codec.parse_payloads(buf, 100, 1, 10)
    finally:
        codec.use_splitter(before)
    assert got == ([b"a", b"bc", b""], 100 + 5 + 6 + 4, None)
    assert bad == ([b"a", b"bc"], 100 + 5 + 6, 0)  # the empty record is under min_size 1


def test_read_job_fills_the_buffer(tmp_path: pytest.TempPathFactory) -> None:
    import errno
    import os
    import select

    path = os.path.join(str(tmp_path), "f")
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * 40)
    fd = os.open(path, os.O_RDONLY)
    w = _writer.Writer(0, 1 << 17)
    try:
        buf, tail = bytearray(100), bytearray(600)
        w.submit_read(fd, buf, 10, 100)
        w.submit_read(fd, tail, 10_000, 500)  # past the end: only 240 bytes are there
        with pytest.raises(BufferError):
            tail.extend(b"x")  # the job holds the buffer: it cannot move while in flight
        w.submit_read(-1, bytearray(4), 0, 4)  # a bad descriptor: EBADF
        got: list[tuple[int, int, int]] = []
        while len(got) < 3:
            select.select([w.fileno()], [], [], 5)
            got.extend(w.reap())
        assert got == [(100, 0, 0), (240, 0, 0), (0, errno.EBADF, 0)]
        assert buf == (bytes(range(256)) * 40)[10:110]
        assert tail[:240] == (bytes(range(256)) * 40)[10_000:]
        tail.extend(b"x")  # reaped: released
        with pytest.raises(ValueError, match="nbytes"):
            w.submit_read(fd, bytearray(10), 0, 11)
    finally:
        w.close()
        os.close(fd)

"""The machinery behind :class:`~aiodiskqueue.DiskQueue`: options, the ioLoop engine, the
segment store and open-time recovery, the I/O thread and the native write lane."""

import os as _os

from .._format import codec as _codec

_split_records: _codec.Splitter | None
try:
    from ._writer import split_records as _split_records
except ImportError:  # pragma: no cover - built wherever a C compiler is present
    _split_records = None


def pure_python() -> bool:
    """Does ``AIODISKQUEUE_PURE_PYTHON`` switch the native code off (read at each open)?"""
    return _os.environ.get("AIODISKQUEUE_PURE_PYTHON", "") not in ("", "0")


if _split_records is not None and not pure_python():
    # Records are split out of read buffers in C (the codec's rule, see codec.parse).
    _codec.use_splitter(_split_records)

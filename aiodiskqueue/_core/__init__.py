"""The machinery behind :class:`~aiodiskqueue.DiskQueue`: options, the ioLoop engine, the
segment store and open-time recovery, the I/O thread and the native write lane."""

import os as _os

from .._format import codec as _codec

_split_records: _codec.Splitter | None
try:
    from ._writer import split_records as _split_records
except ImportError:  # pragma: no cover - built wherever a C compiler is present
    _split_records = None

if _split_records is not None and _os.environ.get("AIODISKQUEUE_PURE_PYTHON", "") in ("", "0"):
    # Records are split out of read buffers in C (the codec's rule, see codec.parse).
    _codec.use_splitter(_split_records)

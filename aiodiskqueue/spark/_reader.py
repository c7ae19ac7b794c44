"""Batch reading: the unread records of one or more queues, without changing them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceReader, InputPartition

from .._codec import HEADER_SIZE
from .._layout import Layout
from ._files import FileSpan, Pos, iter_records, select_queues, view_queue
from ._nsq import NSQ_HEADER_SIZE, decode
from ._options import SourceOptions

RAW_SCHEMA = "name string, file_num long, offset long, payload binary"
NSQ_SCHEMA = RAW_SCHEMA + ", id string, timestamp long, attempts int, body binary"

_RAW_ARROW = pa.schema([
    ("name", pa.string()),
    ("file_num", pa.int64()),
    ("offset", pa.int64()),
    ("payload", pa.binary()),
])
_NSQ_ARROW = pa.schema(list(_RAW_ARROW) + [
    ("id", pa.string()),
    ("timestamp", pa.int64()),
    ("attempts", pa.int32()),
    ("body", pa.binary()),
])


def schema_for(options: SourceOptions) -> str:
    """The DDL schema of rows read with ``options``."""
    return NSQ_SCHEMA if options.nsq else RAW_SCHEMA


@dataclass(frozen=True)
class QueuePartition(InputPartition):
    """Segment file spans of one queue, read in order by one Spark task."""

    directory: str
    queue: str
    spans: tuple[FileSpan, ...]


def group_spans(directory: str, queue: str, spans: list[FileSpan],
                max_bytes: int) -> list[QueuePartition]:
    """Pack consecutive spans into partitions of about ``max_bytes`` (whole files)."""
    out: list[QueuePartition] = []
    cur: list[FileSpan] = []
    size = 0
    for span in spans:
        if cur and size + span.size > max_bytes:
            out.append(QueuePartition(directory, queue, tuple(cur)))
            cur, size = [], 0
        cur.append(span)
        size += span.size
    if cur:
        out.append(QueuePartition(directory, queue, tuple(cur)))
    return out


def read_partition(options: SourceOptions, part: QueuePartition) -> Iterator[Any]:
    """Rows of one partition: Arrow record batches, or tuples with ``arrow=false``."""
    layout = Layout(part.directory, part.queue)
    name = part.queue
    chunks = iter_records(layout, list(part.spans), options.min_msg_size, options.max_msg_size)
    if not options.arrow:
        for recs in chunks:
            for payload, num, end in recs:
                row: tuple[Any, ...] = (name, num, end - HEADER_SIZE - len(payload), payload)
                if options.nsq:
                    row += decode(payload)
                yield row
        return
    schema = _NSQ_ARROW if options.nsq else _RAW_ARROW
    for recs in chunks:
        n = len(recs)
        payloads = [r[0] for r in recs]
        offsets = [r[2] - HEADER_SIZE - len(r[0]) for r in recs]
        nums = [r[1] for r in recs]
        cols: list[pa.Array] = [
            pa.array([name] * n, pa.string()),
            pa.array(nums, pa.int64()),
            pa.array(offsets, pa.int64()),
            pa.array(payloads, pa.binary()),
        ]
        if options.nsq:
            fields = [decode(p) for p in payloads]
            cols.append(pa.array([f[0] for f in fields], pa.string()))
            cols.append(pa.array([f[1] for f in fields], pa.int64()))
            cols.append(pa.array([f[2] for f in fields], pa.int32()))
            cols.append(pa.array([p[NSQ_HEADER_SIZE:] if f[3] is not None else None
                                  for p, f in zip(payloads, fields)], pa.binary()))
        yield pa.RecordBatch.from_arrays(cols, schema=schema)


def plan_queue(options: SourceOptions, queue: str) -> tuple[list[FileSpan], Pos, Pos]:
    """The spans of one queue's unread records, with its read and end positions."""
    view = view_queue(Layout(options.path, queue), options.min_msg_size, options.max_msg_size)
    return view.spans, view.read, view.end


class DiskQueueReader(DataSourceReader):
    """Reads every selected queue from its read position to its end; changes nothing."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[QueuePartition]:
        """One or more segment files per partition, one queue per partition."""
        opts = self.options
        parts: list[QueuePartition] = []
        for queue in select_queues(opts.path, opts.matches):
            spans, _, _ = plan_queue(opts, queue)
            parts.extend(group_spans(opts.path, queue, spans, opts.max_bytes_per_partition))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Rows of ``partition``, in queue order."""
        if not isinstance(partition, QueuePartition):  # Spark's stand-in for "no partitions"
            return iter(())
        return read_partition(self.options, partition)

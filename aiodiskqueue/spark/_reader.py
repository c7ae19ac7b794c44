"""Batch reading: the unread records of one or more queues, without changing them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceReader, InputPartition

from .._format.codec import HEADER_SIZE
from .._format.layout import Layout
from ._files import FileSpan, Pos, iter_records, select_queues, view_queue
from ._nsq import decode
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


def group_spans(options: SourceOptions, planned: list[tuple[str, list[FileSpan]]]
                ) -> list[QueuePartition]:
    """Pack each queue's consecutive spans into partitions (whole spans, one queue each),
    sized by :meth:`SourceOptions.partition_bytes`."""
    target = options.partition_bytes(sum(s.size for _, spans in planned for s in spans))
    out: list[QueuePartition] = []
    for queue, spans in planned:
        cur: list[FileSpan] = []
        size = 0
        for span in spans:
            if cur and size + span.size > target:
                out.append(QueuePartition(options.path, queue, tuple(cur)))
                cur, size = [], 0
            cur.append(span)
            size += span.size
        if cur:
            out.append(QueuePartition(options.path, queue, tuple(cur)))
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
    name_scalar = pa.scalar(name, pa.string())
    for recs in chunks:
        # One chunk holds records of one file; the constant columns cost nothing per row.
        n = len(recs)
        payload_arr = pa.array([r[0] for r in recs], pa.binary())
        ends = pa.array([r[2] for r in recs], pa.int64())
        starts = pc.subtract(ends, pc.add(pc.binary_length(payload_arr).cast(pa.int64()),
                                          HEADER_SIZE))
        cols: list[pa.Array] = [
            pa.repeat(name_scalar, n),
            pa.repeat(pa.scalar(recs[0][1], pa.int64()), n),
            starts,
            payload_arr,
        ]
        if options.nsq:
            fields = [decode(r[0]) for r in recs]
            cols.append(pa.array([f[0] for f in fields], pa.string()))
            cols.append(pa.array([f[1] for f in fields], pa.int64()))
            cols.append(pa.array([f[2] for f in fields], pa.int32()))
            cols.append(pa.array([f[3] for f in fields], pa.binary()))
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
        planned = [(q, plan_queue(opts, q)[0]) for q in select_queues(opts.path, opts.matches)]
        return group_spans(opts, planned)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Rows of ``partition``, in queue order."""
        if not isinstance(partition, QueuePartition):  # Spark's stand-in for "no partitions"
            return iter(())
        return read_partition(self.options, partition)

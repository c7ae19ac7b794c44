"""Batch reading: the unread records of one or more queues, without changing them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructType,
)

from .._format.codec import HEADER_SIZE
from ._errors import DataLoss, PathNotFound, SchemaMismatch, repair_advice
from ._files import FileSpan, Lost, QueueView, iter_records, view_queue
from ._group import lister_for
from ._listing import Listing
from ._nsq import decode
from ._options import SourceOptions
from ._ranges import iter_blocks, split_span

log = logging.getLogger(__name__)

RAW_SCHEMA = "name string, file_num long, offset long, payload binary"
NSQ_SCHEMA = RAW_SCHEMA + ", id string, timestamp long, attempts int, body binary"

_RAW_ARROW = pa.schema([
    ("name", pa.string()),
    ("file_num", pa.int64()),
    ("offset", pa.int64()),
    ("payload", pa.binary()),
])
_NSQ_ARROW = pa.schema([*list(_RAW_ARROW), ("id", pa.string()), ("timestamp", pa.int64()),
                        ("attempts", pa.int32()), ("body", pa.binary())])
_MAX_INT = 2**31 - 1
_RAW_TYPES: tuple[tuple[str, DataType], ...] = (
    ("name", StringType()), ("file_num", LongType()), ("offset", LongType()),
    ("payload", BinaryType()))
_NSQ_TYPES = (*_RAW_TYPES, ("id", StringType()), ("timestamp", LongType()),
              ("attempts", IntegerType()), ("body", BinaryType()))


def schema_for(options: SourceOptions) -> str:
    """The DDL schema of rows read with ``options``."""
    return NSQ_SCHEMA if options.nsq else RAW_SCHEMA


def project(options: SourceOptions, schema: StructType | None) -> tuple[str, ...]:
    """The columns to produce for ``schema`` (a user's schema may pick a subset, in any order).

    Raises SchemaMismatch naming the column that is not one of the source's
    columns or has another type.
    """
    types = dict(_NSQ_TYPES if options.nsq else _RAW_TYPES)
    names = tuple(types)
    if schema is None:
        return names
    for f in schema.fields:
        if f.name not in types or types[f.name] != f.dataType:
            have = f"{f.name} {f.dataType.simpleString()}"
            raise SchemaMismatch(
                f"diskqueue: the schema given to the reader asks for '{have}', which is not a "
                f"column of this source; pick columns of: {schema_for(options)}")
    return tuple(f.name for f in schema.fields) or names


@dataclass(frozen=True)
class QueuePartition(InputPartition):
    """Record ranges of one or more queues, read in order by one Spark task."""

    directory: str
    pieces: tuple[tuple[str, FileSpan], ...]


def group_spans(options: SourceOptions, planned: list[tuple[str, list[FileSpan]]]
                ) -> list[QueuePartition]:
    """Pack the queues' spans into partitions of about :meth:`SourceOptions.partition_bytes`.

    A span larger than that is cut at record boundaries (see :mod:`._ranges`);
    small spans of many queues share a partition, in queue order.
    """
    target = options.partition_bytes(sum(s.size for _, spans in planned for s in spans))
    out: list[QueuePartition] = []
    cur: list[tuple[str, FileSpan]] = []
    size = 0
    for queue, spans in planned:
        layout = options.layout(queue)
        for big in spans:
            for span in split_span(layout, big, target, options.min_msg_size,
                                   options.max_msg_size):
                if cur and size + span.size > target:
                    out.append(QueuePartition(options.path, tuple(cur)))
                    cur, size = [], 0
                cur.append((queue, span))
                size += span.size
    if cur:
        out.append(QueuePartition(options.path, tuple(cur)))
    return out


def _arrow_block(options: SourceOptions, name_scalar: Any, num: int,
                 block: Any, columns: tuple[str, ...]) -> Any:
    starts = block.starts
    n = len(starts) - 1
    bounds = pa.array(starts, pa.int32())
    framed = pa.BinaryArray.from_buffers(pa.binary(), n,
                                         [None, bounds.buffers()[1], pa.py_buffer(block.buf)])
    payload = pc.binary_slice(framed, HEADER_SIZE, _MAX_INT)
    cols: dict[str, Any] = {}
    for col in columns:
        if col == "name":
            cols[col] = pa.repeat(name_scalar, n)
        elif col == "file_num":
            cols[col] = pa.repeat(pa.scalar(num, pa.int64()), n)
        elif col == "offset":
            cols[col] = pc.add(bounds.slice(0, n).cast(pa.int64()), block.base)
        elif col == "payload":
            cols[col] = payload
    if options.nsq and any(c not in _RAW_ARROW.names for c in columns):
        fields = [decode(p) for p in payload.to_pylist()]
        for i, (col, typ) in enumerate((("id", pa.string()), ("timestamp", pa.int64()),
                                         ("attempts", pa.int32()), ("body", pa.binary()))):
            if col in columns:
                cols[col] = pa.array([f[i] for f in fields], typ)
    schema = _NSQ_ARROW if options.nsq else _RAW_ARROW
    return pa.RecordBatch.from_arrays([cols[c] for c in columns],
                                      schema=pa.schema([schema.field(c) for c in columns]))


def read_partition(options: SourceOptions, part: QueuePartition,
                   columns: tuple[str, ...] | None = None) -> Iterator[Any]:
    """Rows of one partition: Arrow record batches, or tuples with ``arrow=false``."""
    if columns is None:
        columns = project(options, None)
    lo, hi = options.min_msg_size, options.max_msg_size
    for name, span in part.pieces:
        layout = options.layout(name)
        if not options.arrow:
            full = project(options, None)
            pick = [full.index(c) for c in columns]
            for recs in iter_records(layout, [span], lo, hi,
                                     fail_on_data_loss=options.fail_on_data_loss):
                for payload, num, end in recs:
                    row: tuple[Any, ...] = (name, num, end - HEADER_SIZE - len(payload), payload)
                    if options.nsq:
                        row += decode(payload)
                    yield tuple(row[i] for i in pick)
            continue
        name_scalar = pa.scalar(name, pa.string())
        for block in iter_blocks(layout, span, lo, hi,
                                 fail_on_data_loss=options.fail_on_data_loss):
            yield _arrow_block(options, name_scalar, span.num, block, columns)


def lost_message(view: QueueView, lost: list[Lost]) -> str:
    """What is gone, for a data loss error or warning."""
    where = ", ".join(f"{list(a)} to {list(b)}" for a, b in lost)
    return (f"the records between positions {where} are gone (a segment file is missing, "
            f"or another process consumed or removed them) in {view.layout.directory}")


def report_lost(options: SourceOptions, view: QueueView, lost: list[Lost]) -> None:
    """Raise DataLoss for ``lost`` with ``failOnDataLoss=true``, else log it.

    Raises DataLoss saying what is gone and how to go on.
    """
    if not lost:
        return
    what = lost_message(view, lost)
    if options.fail_on_data_loss:
        raise DataLoss(
            view.layout.name, what,
            "To go on without them, set the option failOnDataLoss=false (the gone records "
            "are logged and skipped); a missing segment file can also be replaced by an "
            f"empty one with '{repair_advice(view.layout.directory, view.layout.name)}'")
    log.warning("diskqueue: queue %r: %s; skipping them (failOnDataLoss=false)",
                view.layout.name, what)


def missing_ranges(view: QueueView) -> list[Lost]:
    """The ranges of the segments missing between the read and the write position."""
    out: list[Lost] = []
    for num in view.missing:
        stop = view.end if num == view.end[0] else (num + 1, 0)
        start = view.read if num == view.read[0] else (num, 0)
        out.append((start, stop))
    return out


def select(options: SourceOptions) -> Listing:
    """The queues ``name`` selects in ``path`` (a group's shards, keyed ``NAME/SHARD``).

    Raises PathNotFound if ``path`` is missing, not a directory, or holds no
    queue matching ``name`` (a group may have no shard yet); ShardDamaged if a
    group's shard is not a directory.
    """
    listing = lister_for(options)(None)
    if not listing and not options.group:  # a group with no shards yet is empty, not missing
        raise PathNotFound(options.path, options.name, f"holds no queue matching {options.name!r}")
    return listing


class DiskQueueReader(DataSourceReader):
    """Reads every selected queue from its read position to its end; changes nothing."""

    def __init__(self, options: SourceOptions, columns: tuple[str, ...] | None = None) -> None:
        self.options = options
        self.columns = columns or project(options, None)
        select(options)  # fail at planning time, not in a task

    def partitions(self) -> list[QueuePartition]:
        """Byte ranges of the queues' segments at record boundaries, packed by size."""
        opts = self.options
        planned = []
        for queue, files in select(opts).items():
            view = view_queue(opts.layout(queue), opts.min_msg_size, opts.max_msg_size,
                              files=files)
            report_lost(opts, view, missing_ranges(view))
            planned.append((queue, view.spans))
        return group_spans(opts, planned)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Rows of ``partition``, in queue order."""
        if not isinstance(partition, QueuePartition):  # Spark's stand-in for "no partitions"
            return iter(())
        return read_partition(self.options, partition, self.columns)

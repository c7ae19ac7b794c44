"""Streaming reads: offsets ``{queue: [file_num, pos]}``, read limits, Trigger.AvailableNow,
and consume mode, where committing a batch releases it from the queue.

When Spark calls :meth:`DiskQueueStreamReader.commit`
------------------------------------------------------
Spark calls a source's ``commit(end)`` for batch N only while it plans batch
N+1, and only when batch N+1 has data. So the last batch of an
``availableNow`` run would stay in the queue until some later run plans a
batch. Spark's checkpoint keeps the query from reading it twice either way.

In consume mode this source therefore also releases up to the ``start``
offset Spark passes to ``latestOffset(start, limit)``. That is safe because
of how the micro-batch engine (``MicroBatchExecution``) orders its work: it
asks a source for a new end offset only after the previous batch has run and
its id is in the checkpoint's commit log, and ``start`` is exactly that
batch's end. After a restart, a batch that is in the offset log but not in
the commit log is run again from the logged offsets *before* the engine asks
for new ones, so its records are still in the queue. (The one engine mode
that breaks this ordering, asynchronous progress tracking, supports only the
Kafka sink and cannot run with availableNow.) A fresh query starts at the
queue's read position, so its first ``start`` releases nothing.

Queues open in a live DiskQueue
-------------------------------
Releasing a queue means rewriting its meta file and deleting segments, which
only the holder of the queue's lock may do, and a DiskQueue holds that lock for
as long as it is open. So in consume mode a queue whose lock is held is not
read at all in that micro-batch (its offset stays where it is): with a glob
``name`` it is skipped with a warning and picked up once its owner closes it,
which lets producers write to new queue names (``events-0001``, ...) and close
them while one query drains ``events-*``. With a single queue ``name`` the
query fails with :class:`~aiodiskqueue.spark._files.QueueBusy`, naming the
queue and the holder's pid. Without ``consume`` an open queue is read up to
the write position in its meta file, which its owner stores only after an fsync.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from .._format.layout import Layout
from ._consume import QueueBusy, release
from ._files import Pos, QueueView, advance, select_queues, spans_between, view_queue
from ._options import SourceOptions, is_glob
from ._reader import QueuePartition, group_spans, read_partition

log = logging.getLogger("aiodiskqueue.spark")

Offset = dict[str, list[int]]


def _pos(value: Any) -> Pos:
    return (int(value[0]), int(value[1]))


class DiskQueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A micro-batch stream over one queue or a glob of queues."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: dict[str, Pos] | None = None

    # ------------------------------------------------------------- helpers

    def _layout(self, queue: str) -> Layout:
        return Layout(self.options.path, queue)

    def _view(self, queue: str) -> QueueView:
        return view_queue(self._layout(queue), self.options.min_msg_size,
                          self.options.max_msg_size)

    def _queues(self) -> list[str]:
        return select_queues(self.options.path, self.options.matches)

    def _begin(self, queue: str, start: Offset, view: QueueView) -> Pos:
        """Where this stream goes on in ``queue``: its offset in ``start``, else the
        queue's read position.

        In consume mode a read position past the offset means another consumer
        (a DiskQueue that had the queue open in between) took those records, and
        may have deleted their files: go on from the read position, so that
        nothing is delivered twice. This never skips a batch Spark replays,
        because this source releases only what Spark has committed.
        """
        begin = _pos(start[queue]) if queue in start else view.read
        if self.options.consume and view.meta is not None and view.read > begin:
            log.warning("queue %r: records before %s were consumed by another process; "
                        "going on from there", queue, list(view.read))
            begin = view.read
        return begin

    # ------------------------------------------------------------- offsets

    def initialOffset(self) -> Offset:
        """Every selected queue at its read position."""
        return {q: list(self._view(q).read) for q in self._queues()}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRecordsPerTrigger`` or else ``maxBytesPerTrigger``; both apply when both are set."""
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of an ``availableNow`` run: what the queues hold now."""
        self._target = {q: self._view(q).end for q in self._queues()}

    def _limits(self, limit: ReadLimit) -> tuple[int | None, int | None]:
        opts = self.options
        if isinstance(limit, ReadMaxRows):
            return limit.max_rows, opts.max_bytes_per_trigger
        if isinstance(limit, ReadMaxBytes):
            return opts.max_records_per_trigger, limit.max_bytes
        return None, None  # ReadAllAvailable, and limits this source cannot honour

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        """The end offset of the next batch, within ``limit`` (start itself if no data).

        In consume mode, first releases every queue up to ``start``, and reads
        nothing from a queue that a live DiskQueue holds open (see the module
        docstring). Raises QueueBusy if ``name`` is a single queue and it is open.
        """
        if self.options.consume and start:
            self._release_started(start)
        max_rows, max_bytes = self._limits(limit)
        queues = set(self._queues()) | set(start)
        if self._target is not None:
            queues &= set(self._target) | set(start)
        end: Offset = {}
        left = len(queues)
        for queue in sorted(queues):
            view = self._view(queue)
            begin = self._begin(queue, start, view)
            stop = view.end
            if self.options.consume and view.holder is not None:
                self._busy(QueueBusy(view.layout, view.holder, "consume"))
                stop = begin  # it could not be released: leave it to its owner for now
            if self._target is not None:
                stop = min(stop, self._target.get(queue, begin))
            new = begin
            if stop > begin:
                if max_rows is None and max_bytes is None:
                    new = stop
                else:
                    spans = spans_between(view, begin, stop)
                    share_rows = None if max_rows is None else max(1, max_rows // left)
                    share_bytes = None if max_bytes is None else max(1, max_bytes // left)
                    pos, rows, nbytes = advance(view, spans, share_rows, share_bytes,
                                                self.options.min_msg_size,
                                                self.options.max_msg_size)
                    new = pos if pos is not None else begin
                    if max_rows is not None:
                        max_rows = max(0, max_rows - rows)
                    if max_bytes is not None:
                        max_bytes = max(0, max_bytes - nbytes)
            left -= 1
            if queue in start or new != begin:
                end[queue] = list(new)
            if (max_rows == 0 or max_bytes == 0) and end:
                # Budget spent: the remaining queues stay where they are.
                for rest in sorted(queues):
                    if rest > queue and rest in start:
                        end[rest] = list(_pos(start[rest]))
                break
        return dict(sorted(end.items()))

    def reportLatestOffset(self) -> Offset | None:
        """Where every selected queue ends now (for the query's progress report)."""
        return {q: list(self._view(q).end) for q in self._queues()} or None

    # ------------------------------------------------------------- batches

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        """Segment spans between ``start`` and ``end``, one queue per partition."""
        planned = []
        for queue in sorted(end):
            view = self._view(queue)
            begin = self._begin(queue, start, view)
            planned.append((queue, spans_between(view, begin, _pos(end[queue]))))
        return group_spans(self.options, planned)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Rows of one partition, as in a batch read."""
        if not isinstance(partition, QueuePartition):
            return iter(())
        return read_partition(self.options, partition)

    # ------------------------------------------------------------- consume

    def commit(self, end: Offset) -> None:
        """Consume mode: release every queue up to ``end``; otherwise nothing.

        Raises QueueBusy (a QueueLocked) naming the queue and the holder's pid
        if ``name`` is a single queue and a live DiskQueue has it open.
        """
        if not self.options.consume:
            return
        self._release(end)

    def _release_started(self, start: Offset) -> None:
        # See the module docstring for why ``start`` is already in the sink.
        self._release(start)

    def _release(self, offsets: Offset) -> None:
        for queue, pos in sorted(offsets.items()):
            try:
                release(self._layout(queue), _pos(pos), self.options.min_msg_size,
                        self.options.max_msg_size, lock_wait=self.options.lock_wait)
            except QueueBusy as exc:
                self._busy(exc)  # with a glob: released by a later call once it is free

    def _busy(self, exc: QueueBusy) -> None:
        if not is_glob(self.options.name):
            raise exc
        log.warning("%s; skipping it in this micro-batch", exc)

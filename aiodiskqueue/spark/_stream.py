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

Many queues
-----------
Each trigger lists the directory once (:mod:`._listing`); what is known about
a queue is kept between triggers and looked at again only when its meta file
or a segment changed. In consume mode a queue released up to its end is left
out of the offsets (its meta file holds its position); while none of its files
changes it is skipped without a look, and once read to the end of its last
segment its meta file is not even stat'ed while its inode stays the same, so a
drained queue costs its directory entries and one ``stat`` per trigger. Releasing
a queue looks up its segments by number instead of listing the directory.
Small ranges of many queues share a partition (``maxBytesPerPartition``).
``removeDrainedAfter`` removes a queue that is drained, unheld and unchanged for
that many seconds.

Queue groups
------------
A ``name`` with a group directory ``NAME.group/`` beside it selects the group's
shards (:mod:`._group`), keyed ``NAME/000003``: each trigger lists the group
directory, so a shard a new producer process made is read from the next
micro-batch on, and a shard the group removed (drained) drops out. Consuming
works per shard as below; a shard whose consumer role another process holds is
skipped, as a glob's busy queue is. A group with live group consumers
(``QueueGroup`` with ``role="consumer"``) is not consumed at all (``GroupBusy``):
they take free shards at any moment, so both would deliver the same records.

Queues open in a live DiskQueue
-------------------------------
A queue whose producer is live in another process (a DiskQueue opened with
``role="producer"``) is read up to the producer's published position (what its
``put()`` calls have returned for; a record it is still writing is not read), and
in consume mode the stream releases it as the queue's consumer: for each release
it takes the consumer role (waiting up to ``lockWait`` for it), stores the meta's
read half under the meta writers' lock and deletes the segments wholly before the
new read position, never the producer's.

What blocks consuming is a holder of the consumer role (a DiskQueue with
``role="consumer"``, or another consuming stream) or of the whole queue (a
DiskQueue opened with the default ``role="both"``). Such a queue is not read in
that micro-batch and takes no share of the trigger's read limit: with a glob
``name`` it is skipped (logged once until it is free again); with a single queue
``name`` the stream waits up to ``lockWait`` seconds, then fails with
:class:`~aiodiskqueue.spark._consume.QueueBusy` naming the holder's pid and the
lock it holds. Without ``consume`` a queue opened whole is read up to the write
position in its meta file, which its owner stores only after an fsync.

Data loss
---------
Records a stream's offsets still expect can disappear: a DiskQueue worker
consumed them, the queue was purged, a missing segment was replaced by
``repair``. With ``failOnDataLoss=true`` (the default) the query fails saying
what is gone; with ``false`` it logs that and goes on from the oldest record
still there, as Spark's Kafka source does. A torn record at the end of a
completed segment is damage and is treated the same way, by the task that
reads it (:func:`~._errors.report_torn`); a torn tail of the last segment is
what a crash leaves, and is never read.
"""

from __future__ import annotations

import logging
import time
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
from .._format.lock import lock_holder
from .._format.roles import published_record
from ._consume import QueueBusy, consume_blocker, release, remove_drained, wait_unheld
from ._errors import PathNotFound
from ._files import Lost, Pos, QueueView, spans_between, view_queue
from ._group import check_no_group_consumers, lister_for
from ._listing import Listing, QueueFiles, check_directory
from ._options import SourceOptions
from ._ranges import advance
from ._reader import QueuePartition, group_spans, project, read_partition, report_lost

log = logging.getLogger(__name__)

Offset = dict[str, list[int]]


def _pos(value: Any) -> Pos:
    return (int(value[0]), int(value[1]))


class DiskQueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A micro-batch stream over one queue or a glob of queues."""

    def __init__(self, options: SourceOptions, columns: tuple[str, ...] | None = None) -> None:
        self.options = options
        self.columns = columns or project(options, None)
        self._target: dict[str, Pos] | None = None
        self._listing: Listing | None = None
        self._lister = lister_for(options)
        self._cache: dict[str, tuple[QueueFiles, QueueView]] = {}
        # Consume mode: drained queues outside the offsets, by the files the last trigger
        # saw; one whose files are the same object again is skipped without a look.
        self._idle: dict[str, QueueFiles] = {}
        # Those of them read to the end of their last segment with nobody holding them.
        self._settled: dict[str, QueueFiles] = {}
        self._released: dict[str, Pos] = {}
        self._held: set[str] = set()
        self._next = ""  # the queue the next trigger starts with (the first one at or after)
        check_directory(options.path, options.name)
        check_no_group_consumers(options)

    # ------------------------------------------------------------- helpers

    def _layout(self, queue: str) -> Layout:
        return self.options.layout(queue)

    def _list(self) -> Listing:
        self._listing = self._lister(self._settled)
        return self._listing

    def _view(self, queue: str, files: QueueFiles) -> QueueView:
        """The queue's view, computed again only if one of its files changed (or the
        holder the cached view saw is gone)."""
        hit = self._cache.get(queue)
        if hit is not None and (hit[0] is files or hit[0].key == files.key) and (
                hit[1].holder is None or lock_holder(hit[1].layout.lock_path) is not None) and (
                hit[1].published is None or _published(hit[1].layout) == hit[1].published):
            return hit[1]
        view = view_queue(self._layout(queue), self.options.min_msg_size,
                          self.options.max_msg_size, files=files)
        self._cache[queue] = (files, view)
        return view

    def _begin(self, queue: str, start: Offset, view: QueueView) -> Pos:
        """Where this stream goes on in ``queue``: its offset in ``start``, else the
        queue's read position.

        In consume mode, a read position past the offset means another consumer
        took those records; a position past the queue's end means it was purged
        or created anew. Both are data loss (see the module docstring). This never
        skips a batch Spark replays, because this source releases only what Spark
        has committed.
        """
        if queue not in start:
            return view.read
        begin = _pos(start[queue])
        lost: list[Lost] = []
        if begin > view.end:
            lost = [(begin, view.end)]
            begin = view.read
        elif self.options.consume and view.meta is not None and view.read > begin:
            lost = [(begin, view.read)]
            begin = view.read
        report_lost(self.options, view, lost)
        return begin

    def _spans(self, view: QueueView, begin: Pos, stop: Pos) -> list[Any]:
        spans, lost = spans_between(view, begin, stop)
        report_lost(self.options, view, lost)
        return spans

    # ------------------------------------------------------------- offsets

    def initialOffset(self) -> Offset:
        """Every selected queue at its read position.

        Raises PathNotFound if no queue matches ``name`` (a query with a
        checkpoint never asks again, so queues it removed do not count).
        """
        listing = self._list()
        if not listing and not self.options.group:  # a group may have no shard yet
            raise PathNotFound(self.options.path, self.options.name,
                               f"holds no queue matching {self.options.name!r}")
        out: Offset = {}
        for q, files in listing.items():
            view = self._view(q, files)
            if not (self.options.consume and view.drained):
                out[q] = list(view.read)
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRecordsPerTrigger`` or else ``maxBytesPerTrigger``; both apply when both are set."""
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of an ``availableNow`` run: what the queues hold now."""
        self._target = {q: self._view(q, f).end for q, f in self._list().items()}

    def _limits(self, limit: ReadLimit) -> tuple[int | None, int | None]:
        opts = self.options
        if isinstance(limit, ReadMaxRows):
            return limit.max_rows, opts.max_bytes_per_trigger
        if isinstance(limit, ReadMaxBytes):
            return opts.max_records_per_trigger, limit.max_bytes
        return None, None  # ReadAllAvailable, and limits this source cannot honour

    def _readable(self, queue: str, view: QueueView) -> QueueView | None:
        """Consume mode: ``view`` if nobody holds the queue, else None (glob) after
        logging it once; a single name waits up to ``lockWait`` for the holder.

        Raises QueueBusy if a single-name queue stays held.
        """
        blocker = consume_blocker(view.layout)
        if blocker is None:
            self._held.discard(queue)
            return view
        if self.options.many:
            if queue not in self._held:
                self._held.add(queue)
                log.warning("%s; skipping it until it is closed",
                            QueueBusy(view.layout, blocker[0], "consume", blocker[1]))
            return None
        holder = wait_unheld(view.layout, self.options.lock_wait)
        if holder is not None:
            blocker = consume_blocker(view.layout)
            raise QueueBusy(view.layout, holder, "consume",
                            None if blocker is None else blocker[1])
        self._cache.pop(queue, None)
        return view_queue(view.layout, self.options.min_msg_size, self.options.max_msg_size)

    def _drained(self, queue: str, view: QueueView, files: QueueFiles) -> None:
        """A consumed, drained queue: remove it after ``removeDrainedAfter`` seconds unchanged."""
        keep = self.options.remove_drained_after
        if keep is None or files.mtime > time.time() - keep:
            return
        if remove_drained(view.layout, self.options.min_msg_size, self.options.max_msg_size):
            log.info("queue %r: drained and unchanged for %ss; removed", queue, keep)
            # ``_released`` keeps its position: Spark's commit of the batch before may
            # still name the queue, and releasing it again must not create it anew.
            self._cache.pop(queue, None)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        """The end offset of the next batch, within ``limit`` (start itself if no data).

        In consume mode, first releases every queue up to ``start``, and reads
        nothing from a queue that a live DiskQueue holds open (see the module
        docstring). Raises QueueBusy if ``name`` is a single queue that stays
        open for ``lockWait`` seconds, DataLoss if records the offsets need are
        gone and ``failOnDataLoss`` is true.
        """
        opts = self.options
        check_no_group_consumers(opts)
        if opts.consume and start:
            self._release(start)
        listing = self._list()
        max_rows, max_bytes = self._limits(limit)
        queues = set(listing) | set(start)
        if self._target is not None:
            queues &= set(self._target) | set(start)
        end: Offset = {}
        active: list[tuple[str, QueueView, Pos, Pos]] = []
        idle, settled = self._idle, self._settled
        self._idle, self._settled = {}, {}
        skip_idle = opts.consume and opts.remove_drained_after is None
        for queue in sorted(queues):
            files = listing.get(queue)
            if files is None:
                self._vanished(queue, start)
                continue
            if skip_idle and idle.get(queue) is files and queue not in start:
                self._idle[queue] = files  # drained, and not a file changed since
                if settled.get(queue) is files:
                    self._settled[queue] = files
                continue
            view = self._view(queue, files)
            begin = self._begin(queue, start, view)
            stop = view.end
            if self._target is not None:
                stop = min(stop, self._target.get(queue, begin))
            if stop <= begin:
                if not opts.consume or view.read != begin:
                    if queue in start:
                        end[queue] = list(begin)
                elif view.drained and begin == view.end:
                    self._drained(queue, view, files)
                    # Only a queue nobody holds is skipped later: a held one ends at its
                    # holder's meta, and if the holder dies before storing the next one,
                    # no file changes, yet the records after that meta are there to read.
                    if skip_idle and queue not in start and view.holder is None:
                        self._idle[queue] = files
                        last = max(files.sizes, default=-1)
                        if view.end == (last, files.sizes.get(last)):
                            self._settled[queue] = files
                continue
            if opts.consume:
                fresh = self._readable(queue, view)
                if fresh is None:
                    if queue in start:
                        end[queue] = list(begin)
                    continue
                view = fresh
                stop = min(view.end, stop) if self._target is not None else view.end
            active.append((queue, view, begin, stop))
        # Each queue in turn gets what it has, up to what is left of the trigger's limit,
        # starting where the previous trigger stopped: a trigger touches (and releases)
        # as few queues as its limit needs, and no queue waits longer than a round.
        first = next((i for i, a in enumerate(active) if a[0] >= self._next), 0)
        for queue, view, begin, stop in active[first:] + active[:first]:
            new = begin
            if max_rows is None and max_bytes is None:
                new = stop
                self._spans(view, begin, stop)  # reports lost ranges
            elif max_rows != 0 and max_bytes != 0:
                spans = self._spans(view, begin, stop)
                pos, rows, nbytes = advance(view, spans, max_rows, max_bytes,
                                            opts.min_msg_size, opts.max_msg_size)
                new = pos if pos is not None else stop
                if max_rows is not None:
                    max_rows = max(0, max_rows - rows)
                if max_bytes is not None:
                    max_bytes = max(0, max_bytes - nbytes)
                if (max_rows == 0 or max_bytes == 0) and new < stop:
                    self._next = queue  # go on here next time
            if queue in start or new != begin:
                end[queue] = list(new)
        return dict(sorted(end.items()))

    def _vanished(self, queue: str, start: Offset) -> None:
        """A queue in the offsets whose files are all gone: lost, unless it was drained."""
        hit = self._cache.pop(queue, None)
        self._released.pop(queue, None)
        if queue in start and hit is not None and _pos(start[queue]) < hit[1].end:
            report_lost(self.options, hit[1], [(_pos(start[queue]), hit[1].end)])
        else:
            log.info("queue %r is gone; leaving it out of the offsets", queue)

    def reportLatestOffset(self) -> Offset | None:
        """Where every selected queue with unread records ends now (progress report)."""
        listing = self._listing if self._listing is not None else self._list()
        idle = self._idle
        out = {q: list(v.end) for q, f in listing.items()
               if idle.get(q) is not f and not (v := self._view(q, f)).drained}
        return out or None

    # ------------------------------------------------------------- batches

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        """Byte ranges between ``start`` and ``end``, packed into partitions by size."""
        listing = self._listing if self._listing is not None else self._list()
        planned = []
        for queue in sorted(end):
            files = listing.get(queue)
            if files is None:
                files = lister_for(self.options)(None).get(queue)
            if files is None:
                self._vanished(queue, start)
                continue
            view = self._view(queue, files)
            begin = self._begin(queue, start, view)
            planned.append((queue, self._spans(view, begin, _pos(end[queue]))))
        return group_spans(self.options, planned)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Rows of one partition, as in a batch read."""
        if not isinstance(partition, QueuePartition):
            return iter(())
        return read_partition(self.options, partition, self.columns)

    # ------------------------------------------------------------- consume

    def commit(self, end: Offset) -> None:
        """Consume mode: release every queue up to ``end``; otherwise nothing.

        Raises QueueBusy (a QueueLocked) naming the queue and the holder's pid
        if ``name`` is a single queue that a live DiskQueue keeps open for
        ``lockWait`` seconds.
        """
        if not self.options.consume:
            return
        self._release(end)

    def _release(self, offsets: Offset) -> None:
        for queue, pos in sorted(offsets.items()):
            at = _pos(pos)
            if self._released.get(queue) == at:
                continue  # released already by this process
            # A glob skips a held queue at once; a single name waits for its lock.
            wait = 0.0 if self.options.many else self.options.lock_wait
            files = self._listing.get(queue) if self._listing is not None else None
            try:
                release(self._layout(queue), at, self.options.min_msg_size,
                        self.options.max_msg_size, lock_wait=wait,
                        known=files.segments if files is not None else ())
                self._released[queue] = at
            except QueueBusy as exc:
                if not self.options.many:
                    raise
                log.info("%s; releasing it once it is closed", exc)


def _published(layout: Layout) -> Pos | None:
    """A live producer's published position in the queue, None if no producer is live."""
    rec = published_record(layout.role_path("producer"))
    return None if rec is None else rec.at

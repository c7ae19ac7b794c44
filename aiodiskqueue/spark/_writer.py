"""Writing: each task stages segment files; the driver links them into the queue.

Commit protocol (batch and streaming):

1. Every task writes its rows into its own staged files under
   ``DIR/.spark-staging/NAME/JOB/``, rolled by go-diskqueue's rule at
   ``maxBytesPerFile``, fsynced, and returns their paths in its commit message.
2. The driver's ``commit`` takes the queue's lock, renames the staged files to
   the segment numbers after the queue's last record, in partition order, and
   then stores one new meta file with the depth increased. Until that meta is
   stored, an error moves the files back.
3. ``abort`` (and a failed task) removes the staged files. The queue's own
   files are not touched before step 2, so a failed job leaves them byte for
   byte as they were.

Cleaning up: a staging directory holds an ``owner`` file with the driver's
host, JVM pid and start time. The driver creates a batch job's directory;
tasks never create it, so a task still running after its job ended (failed, or
a speculative twin) finds it gone and drops its rows. A streaming query stages
every micro-batch in one directory named after the query (its ``writerId``, or
checkpoint location), which its tasks create when missing; the commit or
abort of each batch removes it with whatever it holds, so a stream leaves
nothing behind however many batches it runs. Every write to a queue (even an
empty one) also removes the staging directories of jobs whose driver process
is gone (a killed driver), as far as this host can tell, and anything older
than a day.

The one window that is not all or nothing: if the driver process dies during
step 2, after some renames and before the meta is stored, the core's recovery
finds the renamed segments on the next open (records past the meta's write
position are kept, as after any crash), so a prefix of the job's records is
in the queue although Spark reports the job failed.

A streaming sink also records, after the meta, the last batch id it appended
(``NAME.diskqueue.spark-sink.json``, replaced atomically), keyed by the
``writerId`` option or else the query's checkpoint location and query id; a
replayed batch id is not appended again. A driver crash between the meta and
that record would append the replayed batch a second time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from .._format.access import queue_modes
from .._format.layout import Layout
from ..errors import MessageSizeError
from . import _nsq
from ._options import OptionError, SourceOptions, require_single_name
from ._staging import (
    StagedFile,
    StagedWriter,
    create_job_dir,
    link,
    owner_line,
    remove_staged,
    remove_staging_dir,
    staging_dir,
    sweep_staging,
)


@dataclass(frozen=True)
class StagedMessage(WriterCommitMessage):
    """What one task wrote: its staged files, in order."""

    files: tuple[StagedFile, ...]


def check_write_schema(options: SourceOptions, schema: StructType) -> str:
    """The column to write (``payload``, or ``body`` with ``format=nsq``).

    Raises OptionError if the DataFrame lacks it or it is not binary or string.
    """
    column = "body" if options.nsq else "payload"
    fields = {f.name: f for f in schema.fields}
    if column not in fields:
        raise OptionError(
            "format",
            f"is {options.format!r}, so the DataFrame needs a binary column {column!r}; "
            f"it has {sorted(fields)}",
        )
    if not isinstance(fields[column].dataType, (BinaryType, StringType)):
        raise OptionError(
            "format",
            f"is {options.format!r}: column {column!r} must be binary or string, "
            f"got {fields[column].dataType.simpleString()}",
        )
    return column


def _payloads(batch: pa.RecordBatch, column: str, options: SourceOptions) -> list[bytes]:
    col = batch.column(column)
    if col.null_count:
        raise ValueError(f"diskqueue: column {column!r} holds a null; a message cannot be null")
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        values = [v.encode() for v in col.to_pylist()]
    else:
        values = col.to_pylist()
    if options.nsq:
        names = batch.schema.names
        ids = batch.column("id").to_pylist() if "id" in names else None
        stamps = batch.column("timestamp").to_pylist() if "timestamp" in names else None
        tries = batch.column("attempts").to_pylist() if "attempts" in names else None
        values = [
            _nsq.encode(
                body,
                ids[i].encode() if ids is not None and ids[i] is not None else None,
                stamps[i] if stamps is not None else None,
                tries[i] if tries is not None and tries[i] is not None else 0,
            )
            for i, body in enumerate(values)
        ]
    lo, hi = options.min_msg_size, options.max_msg_size
    for v in values:
        if not lo <= len(v) <= hi:
            raise MessageSizeError(len(v), lo, hi)
    return values


def _layout(options: SourceOptions) -> Layout:
    """The queue written, with the modes of the files and directories the write creates:
    ``fileMode`` and ``dirMode``, else those of the queue's files (owner-only for a new
    queue)."""
    lay = queue_modes(Layout(options.path, require_single_name(options)))
    return dataclasses.replace(
        lay, file_mode=lay.file_mode if options.file_mode is None else options.file_mode,
        dir_mode=lay.dir_mode if options.dir_mode is None else options.dir_mode)


def write_task(options: SourceOptions, job: str, column: str,
               batches: Iterator[pa.RecordBatch], owner: str | None) -> StagedMessage:
    """Stage one task's rows; remove what it staged if anything fails.

    With ``owner`` (streaming) the task creates the staging directory if it is
    missing, naming the driver in it; a batch task (``owner`` None) whose
    directory is gone belongs to a job that already ended, and stages nothing.
    """
    layout = _layout(options)
    where = staging_dir(layout, job)
    create = owner is not None
    writer = StagedWriter(where, options.max_bytes_per_file, owner, layout.file_mode,
                          layout.dir_mode)
    try:
        for batch in batches:
            writer.write(_payloads(batch, column, options))
        files = writer.close()
    except FileNotFoundError:
        writer.discard()
        if create or os.path.isdir(where):
            raise
        return StagedMessage(())  # the job ended (failed, or a speculative twin won)
    except BaseException:
        writer.discard()
        raise
    if not create and not os.path.isdir(where):
        remove_staged(files)  # the job ended while this attempt ran
        return StagedMessage(())
    return StagedMessage(tuple(files))


def _files(messages: list[WriterCommitMessage | None]) -> list[StagedFile]:
    return [f for m in messages if isinstance(m, StagedMessage) for f in m.files]


class _Base:
    """What the batch and the streaming writer share: option checks and cleanup."""

    def __init__(self, options: SourceOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise OptionError("mode", "must be 'append': a queue cannot be overwritten by Spark")
        self.options = options
        self.name = require_single_name(options)
        self.column = check_write_schema(options, schema)
        self.layout = _layout(options)
        self.owner = owner_line()
        self.job = uuid.uuid4().hex

    def _cleanup(self, messages: list[WriterCommitMessage | None]) -> None:
        # Spark calls abort while tasks of the failed job may still run: removing the
        # directory makes them drop their rows (see write_task).
        remove_staged(_files(messages))
        remove_staging_dir(staging_dir(self.layout, self.job))
        sweep_staging(self.layout)


class DiskQueueWriter(_Base, DataSourceArrowWriter):
    """``df.write.format("diskqueue")``: append a DataFrame to one queue, all or nothing."""

    def __init__(self, options: SourceOptions, schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        create_job_dir(staging_dir(self.layout, self.job), self.owner, self.layout.file_mode,
                       self.layout.dir_mode)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        """Stage this task's rows."""
        return write_task(self.options, self.job, self.column, iterator, None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Link every staged file into the queue under its lock."""
        try:
            link(self.layout, _files(messages), self.options.min_msg_size,
                 self.options.max_msg_size, lock_wait=self.options.lock_wait)
        finally:
            self._cleanup(messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Remove the staged files; the queue is untouched."""
        self._cleanup(messages)


class DiskQueueStreamWriter(_Base, DataSourceStreamArrowWriter):
    """``writeStream.format("diskqueue")``: each micro-batch appended once."""

    def __init__(self, options: SourceOptions, schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        if options.writer_id is None and options.checkpoint_location is None:
            raise OptionError(
                "writerId",
                "is required when the query's checkpointLocation is not an option of the "
                "sink: it tells this query's batch ids from another query's",
            )
        self._key: str | None = options.writer_id
        # Spark makes a writer for the tasks and another one for each commit: both
        # find the query's staging directory by its name.
        query = f"{options.writer_id}\0{options.checkpoint_location}"
        self.job = "stream-" + hashlib.sha256(query.encode()).hexdigest()[:24]

    def writer_key(self) -> str:
        """Whose batch ids these are: ``writerId``, or else the checkpoint and query id.

        A query keeps its id (``metadata`` in the checkpoint) across restarts, and a
        new checkpoint at the same place gets a new one, so its batch 0 is not mistaken
        for a replay of the old query's batch 0.
        """
        if self._key is None:
            ck = self.options.checkpoint_location or ""
            local = ck.removeprefix("file:")
            try:
                with open(os.path.join(local, "metadata"), "rb") as f:
                    query_id = json.loads(f.readline()).get("id")
            except (OSError, ValueError, AttributeError):
                query_id = None
            self._key = f"{ck}#{query_id}" if query_id else ck
        return self._key

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        """Stage this task's rows of the current micro-batch."""
        return write_task(self.options, self.job, self.column, iterator, self.owner)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Link the batch's files, unless batch ``batchId`` was already appended; then
        remove the query's staging directory (the next batch's tasks create it again)."""
        try:
            link(self.layout, _files(messages), self.options.min_msg_size,
                 self.options.max_msg_size, (self.writer_key(), batchId),
                 lock_wait=self.options.lock_wait)
        finally:
            self._cleanup(messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Remove the batch's staged files and the query's staging directory."""
        self._cleanup(messages)

"""A PySpark data source for aiodiskqueue queues (Python Data Source API, Spark 4).

::

    import aiodiskqueue.spark
    aiodiskqueue.spark.register(spark)
    df = (spark.read.format("diskqueue").option("path", "/data/queues")
          .option("name", "events").load())

Batch read (changes nothing), streaming read (``consume=true`` releases what
each committed batch read), batch and streaming write (all or nothing, under
the queue's lock). A ``name`` that is a queue group (``path/NAME.group/``) is
read and consumed as one source of all its shards. Needs the ``spark`` extra
(pyspark >= 4.2, pyarrow); ``import aiodiskqueue`` alone never imports pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    from pyspark.sql.datasource import DataSource
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "aiodiskqueue.spark needs pyspark and pyarrow: pip install 'asyncio-diskqueue[spark]'"
    ) from exc

from ._consume import QueueBusy
from ._errors import DataLoss, PathNotFound, SchemaMismatch
from ._group import GroupBusy, resolve
from ._options import OptionError, SourceOptions, check_use, parse_options
from ._reader import DiskQueueReader, project, schema_for
from ._stream import DiskQueueStreamReader
from ._writer import DiskQueueStreamWriter, DiskQueueWriter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "DataLoss",
    "DiskQueueDataSource",
    "GroupBusy",
    "OptionError",
    "PathNotFound",
    "QueueBusy",
    "SchemaMismatch",
    "register",
]

SHORT_NAME = "diskqueue"


class DiskQueueDataSource(DataSource):
    """The ``diskqueue`` format: see the module docstring and the README for options."""

    @classmethod
    def name(cls) -> str:
        """The short name used with ``format(...)``."""
        return SHORT_NAME

    def _options(self, use: str | None = None) -> SourceOptions:
        if use is not None:
            check_use(self.options, use)
        options = parse_options(self.options)
        return options if use is None else resolve(options, use)

    def schema(self) -> str:
        """``name, file_num, offset, payload`` (+ ``id, timestamp, attempts, body`` for nsq)."""
        return schema_for(self._options())

    def reader(self, schema: StructType) -> DiskQueueReader:
        """A batch reader over the selected queues, producing the columns of ``schema``.

        Raises OptionError for an option that does not apply to a batch read,
        SchemaMismatch if ``schema`` asks for a column the source does not have,
        PathNotFound if ``path`` is missing or holds no queue matching ``name``.
        """
        options = self._options("batch read")
        return DiskQueueReader(options, project(options, schema))

    def streamReader(self, schema: StructType) -> DiskQueueStreamReader:
        """A micro-batch stream reader over the selected queues (see ``reader``)."""
        options = self._options("streaming read")
        return DiskQueueStreamReader(options, project(options, schema))

    def writer(self, schema: StructType, overwrite: bool) -> DiskQueueWriter:
        """A batch writer appending to one queue."""
        return DiskQueueWriter(self._options("batch write"), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DiskQueueStreamWriter:
        """A streaming writer appending each micro-batch once."""
        return DiskQueueStreamWriter(self._options("streaming write"), schema, overwrite)


def register(spark: SparkSession | Any) -> None:
    """Register the ``diskqueue`` format with ``spark``."""
    spark.dataSource.register(DiskQueueDataSource)

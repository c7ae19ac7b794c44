"""Reading a queue through the Spark source, for the Spark tests."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession


def read_df(spark: SparkSession, path: Path, name: str, **options: str) -> DataFrame:
    """A batch read of queue ``name`` in ``path`` with ``options``."""
    reader = spark.read.format("diskqueue").option("path", str(path)).option("name", name)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def payloads(df: DataFrame) -> list[bytes]:
    """Payloads in queue order (by name, file number and offset)."""
    rows = df.orderBy("name", "file_num", "offset").select("payload").collect()
    return [bytes(r.payload) for r in rows]

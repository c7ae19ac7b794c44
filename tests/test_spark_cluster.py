"""The ``diskqueue`` source on a Spark standalone cluster: a Master and a Worker started
here from the pyspark package, bound to 127.0.0.1, and stopped at the end.

Partitions run in executor processes that share nothing with the driver but the
queue files. The driver runs in a subprocess (this process may already hold a
local[2] SparkContext, and a process can hold only one).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark  # the spark extra, installed by bash dev.sh test: never skipped
import pytest

from aiodiskqueue import DiskQueue

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

SPARK_HOME = os.path.dirname(pyspark.__file__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {log} after {timeout}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` of a Master with one Worker (2 cores)."""
    work = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(work)}
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(work / "master.log", "wb") as mlog:
            master = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(free_port())],
                env=env, stdout=mlog, stderr=subprocess.STDOUT)
        procs.append(master)
        wait_for_line(work / "master.log", "I have been elected leader", master, 120)
        with open(work / "worker.log", "wb") as wlog:
            worker = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--cores", "2", "--memory", "2g", "--webui-port", str(free_port()),
                 "--work-dir", str(work / "work")],
                env=env, stdout=wlog, stderr=subprocess.STDOUT)
        procs.append(worker)
        wait_for_line(work / "worker.log", "Successfully registered with master", worker, 120)
        yield url
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


DRIVER = r'''
import json, os, sys
from pyspark.sql import SparkSession, functions as F
import aiodiskqueue.spark

url, qdir, out = sys.argv[1:4]
spark = (SparkSession.builder.master(url).appName("aiodiskqueue-cluster-test")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.pyspark.python", sys.executable)
         .config("spark.executor.memory", "768m").config("spark.cores.max", "2")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
aiodiskqueue.spark.register(spark)
df = (spark.read.format("diskqueue").option("path", qdir).option("name", "events-*")
      .option("minPartitions", "4").load())
pids = df.rdd.mapPartitions(lambda _: [os.getpid()]).distinct().collect()
batch = sorted(bytes(r.payload).decode() for r in df.select("payload").collect())
q = (spark.readStream.format("diskqueue").option("path", qdir).option("name", "events-*")
     .option("consume", "true").option("maxRecordsPerTrigger", "700").load()
     .writeStream.format("parquet").option("path", out + "/data")
     .option("checkpointLocation", out + "/ck").trigger(availableNow=True).start())
q.awaitTermination()
streamed = sorted(bytes(r.payload).decode() for r in spark.read.parquet(out + "/data").collect())
(spark.range(0, 1500, numPartitions=3)
 .select(F.format_string("w%04d", "id").cast("binary").alias("payload"))
 .write.format("diskqueue").option("path", qdir).option("name", "written")
 .mode("append").save())
print(json.dumps({"driver": os.getpid(), "tasks": pids, "partitions": df.rdd.getNumPartitions(),
                  "batch": batch, "streamed": streamed}))
spark.stop()
'''


async def fill(directory: Path, name: str, items: list[bytes]) -> None:
    async with DiskQueue(directory, name, max_bytes_per_file=4096) as q:
        await q.put_many(items)


async def drain(directory: Path, name: str) -> list[bytes]:
    out = []
    async with DiskQueue(directory, name) as q:
        while not q.empty():
            out.append(await asyncio.wait_for(q.get(), 30))
    return out


def test_read_stream_and_write_on_a_standalone_cluster(cluster: str, tmp_path: Path) -> None:
    qdir, out = tmp_path / "queues", tmp_path / "out"
    want = []
    for k in range(3):
        items = [b"e%d-%04d" % (k, i) for i in range(1000)]
        asyncio.run(fill(qdir, f"events-{k}", items))
        want += [i.decode() for i in items]
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    done = subprocess.run([sys.executable, str(script), cluster, str(qdir), str(out)],
                          capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["partitions"] >= 4
    # Tasks ran in executor processes, not in the driver.
    assert result["driver"] not in result["tasks"]
    assert result["batch"] == sorted(want)
    assert result["streamed"] == sorted(want)
    assert asyncio.run(drain(qdir, "written")) == [b"w%04d" % i for i in range(1500)]


# ------------------------------------------------------------------ Spark Connect

CONNECT_CLIENT = r'''
import json, sys
from pyspark.sql import SparkSession, functions as F
import aiodiskqueue.spark

url, qdir, out = sys.argv[1:4]
spark = SparkSession.builder.remote(url).getOrCreate()
aiodiskqueue.spark.register(spark)
df = (spark.read.format("diskqueue").option("path", qdir).option("name", "events-*")
      .option("minPartitions", "3").load())
batch = sorted(bytes(r.payload).decode() for r in df.select("payload").collect())
(spark.range(0, 500, numPartitions=2)
 .select(F.format_string("c%04d", "id").cast("binary").alias("payload"))
 .write.format("diskqueue").option("path", qdir).option("name", "written")
 .mode("append").save())
q = (spark.readStream.format("diskqueue").option("path", qdir).option("name", "events-*")
     .option("consume", "true").option("maxRecordsPerTrigger", "700").load()
     .writeStream.format("parquet").option("path", out + "/data")
     .option("checkpointLocation", out + "/ck").trigger(availableNow=True).start())
q.awaitTermination()
streamed = sorted(bytes(r.payload).decode() for r in spark.read.parquet(out + "/data").collect())
print(json.dumps({"batch": batch, "streamed": streamed}))
'''


def test_read_stream_and_write_through_spark_connect(tmp_path: Path) -> None:
    # The Spark Connect client needs pyspark's ``connect`` extra (grpcio, grpcio-status,
    # pandas < 3, ...), which the ``spark`` extra does not pull in.
    import grpc_status  # type: ignore[import-untyped]  # noqa: F401  - pyspark[connect], never skipped
    port = free_port()
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable}
    log = tmp_path / "connect.log"
    # What sbin/start-connect-server.sh runs, in the foreground so the test owns the process.
    with open(log, "wb") as f:
        server = subprocess.Popen(
            [os.path.join(SPARK_HOME, "bin", "spark-submit"), "--class",
             "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]",
             "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", "spark.ui.enabled=false"],
            env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_for_line(log, "Spark Connect server started", server, 180)
        qdir, out = tmp_path / "queues", tmp_path / "out"
        want = []
        for k in range(2):
            items = [b"e%d-%04d" % (k, i) for i in range(700)]
            asyncio.run(fill(qdir, f"events-{k}", items))
            want += [i.decode() for i in items]
        script = tmp_path / "client.py"
        script.write_text(CONNECT_CLIENT)
        done = subprocess.run([sys.executable, str(script), f"sc://127.0.0.1:{port}", str(qdir),
                               str(out)], capture_output=True, text=True, timeout=600,
                              check=False)
        assert done.returncode == 0, done.stderr[-5000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["batch"] == sorted(want)
        assert result["streamed"] == sorted(want)
        assert asyncio.run(drain(qdir, "written")) == [b"c%04d" % i for i in range(500)]
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

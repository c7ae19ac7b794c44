"""``aiodiskqueue.metrics``: statistics() exported through a prometheus_client registry."""

from __future__ import annotations

import gc
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import aiodiskqueue.metrics as metrics_module
from aiodiskqueue import DiskQueue
from aiodiskqueue.metrics import DiskQueueCollector, instrument

GAUGES = {
    "aiodiskqueue_depth": "depth",
    "aiodiskqueue_bytes_on_disk": "bytes_on_disk",
    "aiodiskqueue_ready_messages": "ready",
    "aiodiskqueue_pending_writes": "pending_writes",
    "aiodiskqueue_read_file_num": "read_file_num",
    "aiodiskqueue_read_pos": "read_pos",
    "aiodiskqueue_write_file_num": "write_file_num",
    "aiodiskqueue_write_pos": "write_pos",
    "aiodiskqueue_recovered_messages": "recovered",
}
COUNTERS = {
    "aiodiskqueue_puts_total": "puts",
    "aiodiskqueue_gets_total": "gets",
    "aiodiskqueue_syncs_total": "syncs",
    "aiodiskqueue_bad_files_total": "bad_files",
}


@pytest.fixture
async def queue(tmp_path: Path) -> AsyncIterator[DiskQueue]:
    async with DiskQueue(tmp_path / "a", "events", max_bytes_per_file=100) as q:
        yield q


def value(reg: CollectorRegistry, name: str, q: DiskQueue) -> float | None:
    return reg.get_sample_value(name, {"queue": q.name, "directory": q.directory})


async def test_every_metric_follows_statistics(queue: DiskQueue) -> None:
    reg = CollectorRegistry()
    instrument(queue, reg)
    await queue.put_many([b"m" * 30 for _ in range(7)])
    for _ in range(3):
        await queue.get()
    await queue.sync()
    stats = queue.statistics()
    for name, field in {**GAUGES, **COUNTERS}.items():
        assert value(reg, name, queue) == float(getattr(stats, field)), name
    assert value(reg, "aiodiskqueue_puts_total", queue) == 7.0
    assert value(reg, "aiodiskqueue_gets_total", queue) == 3.0
    assert value(reg, "aiodiskqueue_depth", queue) == 4.0
    # 34-byte records, two to a 100-byte file: the 7th opens file 3
    assert value(reg, "aiodiskqueue_write_file_num", queue) == 3.0


async def test_exposition_types_match_the_documented_names(queue: DiskQueue) -> None:
    reg = CollectorRegistry()
    instrument(queue, reg)
    text = generate_latest(reg).decode()
    # prometheus_client versions differ on whether TYPE names a counter with "_total".
    types = {n.removesuffix("_total"): t
             for n, t in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE)}
    expected = dict.fromkeys(GAUGES, "gauge")
    expected.update({n.removesuffix("_total"): "counter" for n in COUNTERS})
    assert types == expected
    doc = metrics_module.__doc__ or ""
    documented = set(re.findall(r"``(aiodiskqueue_[a-z_]+)``", doc))
    assert documented == set(GAUGES) | set(COUNTERS)


async def test_queues_are_labelled_apart_and_removable(queue: DiskQueue, tmp_path: Path) -> None:
    reg = CollectorRegistry()
    async with DiskQueue(tmp_path / "b", "events") as other:
        c1 = instrument(queue, reg)
        c2 = instrument(other, reg)
        assert c1 is c2  # one collector per registry
        instrument(other, reg)  # twice: still one series
        await other.put(b"x")
        assert value(reg, "aiodiskqueue_puts_total", other) == 1.0
        assert value(reg, "aiodiskqueue_puts_total", queue) == 0.0
        assert generate_latest(reg).decode().count("aiodiskqueue_puts_total{") == 2
        c1.remove(other)
        assert value(reg, "aiodiskqueue_puts_total", other) is None
        assert value(reg, "aiodiskqueue_puts_total", queue) == 0.0


async def test_collector_holds_queues_weakly(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    collector = DiskQueueCollector(namespace="svc")
    reg.register(collector)
    q = await DiskQueue.open(tmp_path, "tmp")
    collector.add(q)
    await q.put(b"y")
    labels = {"queue": "tmp", "directory": str(tmp_path)}
    assert reg.get_sample_value("svc_depth", labels) == 1.0
    await q.aclose()
    del q
    gc.collect()
    assert collector.queues() == []
    assert reg.get_sample_value("svc_depth", labels) is None


def test_registering_names_up_front() -> None:
    collector = DiskQueueCollector()
    names = {m.name for m in collector.describe()}
    assert names == set(GAUGES) | {n.removesuffix("_total") for n in COUNTERS}
    reg = CollectorRegistry()
    reg.register(collector)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        reg.register(DiskQueueCollector())

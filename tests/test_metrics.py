"""``aiodiskqueue.metrics``: statistics() exported through a prometheus_client registry."""

from __future__ import annotations

import asyncio
import gc
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import aiodiskqueue.metrics as metrics_module
from aiodiskqueue import AckQueue, DiskQueue
from aiodiskqueue.ack.clock import ManualClock
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
ACK_GAUGES = {
    "aiodiskqueue_ack_ready_messages": "depth",
    "aiodiskqueue_ack_in_flight": "in_flight",
    "aiodiskqueue_ack_deferred": "deferred",
    "aiodiskqueue_ack_log_bytes": "log_bytes",
    "aiodiskqueue_ack_log_segments": "log_segments",
}
ACK_COUNTERS = {
    "aiodiskqueue_ack_delivered_total": "delivered",
    "aiodiskqueue_ack_finished_total": "finished",
    "aiodiskqueue_ack_requeued_total": "requeued",
    "aiodiskqueue_ack_timed_out_total": "timed_out",
    "aiodiskqueue_ack_dead_lettered_total": "dead_lettered",
    "aiodiskqueue_ack_commits_total": "commits",
    "aiodiskqueue_ack_log_syncs_total": "log_syncs",
}
ALL_COUNTERS = {**COUNTERS, **ACK_COUNTERS}
ALL_GAUGES = {**GAUGES, **ACK_GAUGES}


@pytest.fixture
async def queue(tmp_path: Path) -> AsyncIterator[DiskQueue]:
    async with DiskQueue(tmp_path / "a", "events", max_bytes_per_file=100) as q:
        yield q


def value(reg: CollectorRegistry, name: str, q: DiskQueue | AckQueue) -> float | None:
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
    assert types == expected  # no delivery families without an AckQueue
    doc = metrics_module.__doc__ or ""
    documented = set(re.findall(r"``(aiodiskqueue_[a-z_]+)``", doc))
    assert documented == set(ALL_GAUGES) | set(ALL_COUNTERS)


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
    assert names == set(ALL_GAUGES) | {n.removesuffix("_total") for n in ALL_COUNTERS}
    reg = CollectorRegistry()
    reg.register(collector)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        reg.register(DiskQueueCollector())


# ---------------------------------------------------------------------- AckQueue


async def test_ack_queue_exports_every_delivery_figure(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    clock = ManualClock()
    async with AckQueue(tmp_path, "jobs", clock=clock, msg_timeout=10.0,
                        max_attempts=1) as q:  # a second delivery dead-letters
        instrument(q, reg)
        await q.put_many([b"a", b"b", b"c"])
        await q.put(b"later", delay=60.0)
        await (await q.get()).finish()
        await (await q.get()).requeue()
        m = await q.get()  # b"b" is dead-lettered on the way, b"c" delivered
        assert m.body == b"c"
        clock.advance(11.0)  # its deadline passes: timed out, requeued automatically
        with pytest.raises(TimeoutError):  # b"c" is dead-lettered too, nothing delivered
            await asyncio.wait_for(q.get(), 0.05)
        await q.put(b"d")
        await q.get()  # left in flight
        await q.sync()
        ack = q.statistics()
        assert (ack.finished, ack.requeued, ack.timed_out, ack.dead_lettered,
                ack.deferred, ack.in_flight, ack.delivered) == (1, 1, 1, 2, 1, 1, 4)
        for name, field in {**ACK_GAUGES, **ACK_COUNTERS}.items():
            assert value(reg, name, q) == float(getattr(ack, field)), name
        for name, field in {**GAUGES, **COUNTERS}.items():  # the data queue's figures
            assert value(reg, name, q) == float(getattr(ack.queue, field)), name
        assert value(reg, "aiodiskqueue_ack_in_flight", q) == 1.0
        assert value(reg, "aiodiskqueue_ack_deferred", q) == 1.0
        assert value(reg, "aiodiskqueue_ack_dead_lettered_total", q) == 2.0
        assert value(reg, "aiodiskqueue_ack_timed_out_total", q) == 1.0
        assert value(reg, "aiodiskqueue_ack_requeued_total", q) == 1.0
        assert value(reg, "aiodiskqueue_ack_finished_total", q) == 1.0
        assert value(reg, "aiodiskqueue_ack_delivered_total", q) == 4.0
        assert value(reg, "aiodiskqueue_gets_total", q) == 4.0  # taken out of the data queue
        instrument(q.dead_letters, reg)
        assert value(reg, "aiodiskqueue_depth", q.dead_letters) == 2.0


async def test_ack_and_byte_queues_share_one_collector(tmp_path: Path,
                                                       queue: DiskQueue) -> None:
    reg = CollectorRegistry()
    async with AckQueue(tmp_path, "ack") as aq:
        collector = instrument(aq, reg)
        assert instrument(queue, reg) is collector
        await aq.put(b"x")
        text = generate_latest(reg).decode()
        types = {n.removesuffix("_total"): t
                 for n, t in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE)}
        expected = dict.fromkeys(ALL_GAUGES, "gauge")
        expected.update({n.removesuffix("_total"): "counter" for n in ALL_COUNTERS})
        assert types == expected
        assert text.count("aiodiskqueue_ack_in_flight{") == 1  # only the AckQueue
        assert text.count("aiodiskqueue_puts_total{") == 2
        assert value(reg, "aiodiskqueue_ack_ready_messages", aq) == 1.0
        collector.remove(aq)
        assert value(reg, "aiodiskqueue_ack_ready_messages", aq) is None
        assert "aiodiskqueue_ack_" not in generate_latest(reg).decode()


async def test_ack_queue_is_held_weakly(tmp_path: Path) -> None:
    collector = DiskQueueCollector()
    aq = await AckQueue.open(tmp_path, "weak")
    collector.add(aq)
    assert collector.queues() == [aq]
    await aq.aclose()
    del aq
    gc.collect()
    assert collector.queues() == []


def test_instrument_refuses_other_objects() -> None:
    with pytest.raises(TypeError, match="takes a DiskQueue or an AckQueue, got str"):
        instrument("queue", CollectorRegistry())  # type: ignore[arg-type]

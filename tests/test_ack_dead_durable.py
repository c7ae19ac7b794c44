"""A dead letter is durable in the dead-letter queue before the ack log says "done".

Power-cut ordering: the log's ``D`` record for a dead-lettered message may become durable
at any write of the log (a commit fsyncs it, so does a segment roll or a compaction), so
it must not be written before the dead-letter queue holds the message durably. Otherwise
a cut in between leaves the message in neither queue: replay drops the entry, and the
dead-letter queue's put had only reached the OS.

The test records, in order, the dead-letter queue's puts and completed ``sync()`` calls
and every batch of records handed to the ack log, and checks that no ``D`` record was
handed to the log before the dead letter it stands for was covered by a completed sync.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aiodiskqueue import AckQueue, DiskQueue
from aiodiskqueue.ack import log as ack_log
from aiodiskqueue.ack.clock import ManualClock
from aiodiskqueue.ack.codec import KIND_DONE

N = 20


class Recorder:
    """Dead letters put, dead letters made durable, ``D`` records handed to the log."""

    def __init__(self) -> None:
        self.put = 0
        self.durable = 0
        self.done_written = 0
        self.violations: list[str] = []

    def instrument(self, dead: DiskQueue) -> None:
        put_many, put, sync = dead.put_many, dead.put, dead.sync

        async def put_many_(items: Any) -> None:
            items = list(items)
            await put_many(items)
            self.put += len(items)

        async def put_(item: Any) -> None:
            await put(item)
            self.put += 1

        async def sync_() -> None:
            covered = self.put  # a sync covers what was put before it was asked for
            await sync()
            self.durable = max(self.durable, covered)

        dead.put_many = put_many_  # type: ignore[method-assign]
        dead.put = put_  # type: ignore[method-assign]
        dead.sync = sync_  # type: ignore[method-assign]

    def log_write(self, records: list[bytes]) -> None:
        n = sum(1 for r in records if r[0] == KIND_DONE)
        if n:
            self.done_written += n
            if self.done_written > self.durable:
                self.violations.append(
                    f"{self.done_written} D record(s) written to the ack log, only "
                    f"{self.durable} dead letter(s) durable")


@pytest.mark.parametrize("how", ["requeue", "timeout"])
async def test_dead_letter_is_durable_before_its_done_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    rec = Recorder()
    run = ack_log.AckLog.run

    def run_(self: ack_log.AckLog, job: ack_log.LogJob) -> ack_log.LogResult:
        rec.log_write(job.records)
        return run(self, job)

    monkeypatch.setattr(ack_log.AckLog, "run", run_)
    clock = ManualClock()
    # The default sync settings: the dead-letter queue's put returns once written to the OS.
    async with AckQueue(tmp_path, "jobs", max_attempts=1, clock=clock, msg_timeout=5.0,
                        log_segment_bytes=4096) as q:
        rec.instrument(q.dead_letters)
        await q.put_many([b"poison-%03d" % i for i in range(N)])
        await q.sync()  # the puts are durable
        for _ in range(N):
            m = await asyncio.wait_for(q.get(), 10)
            if how == "requeue":
                await m.requeue()  # its last attempt: dead-lettered
        if how == "timeout":
            clock.advance(6.0)
        for _ in range(1000):
            if q.statistics().dead_lettered == N:
                break
            await asyncio.sleep(0.002)
        assert q.statistics().dead_lettered == N
        await q.sync()  # the commit that writes and fsyncs the log's D records
        assert rec.done_written == N
        assert q.dead_letters.qsize() == N
    assert rec.violations == []
    # And after a clean reopen nothing is delivered twice or lost.
    async with AckQueue(tmp_path, "jobs", max_attempts=1) as q:
        assert q.qsize() == 0
        assert q.dead_letters.qsize() == N

"""The blocking group producer (aiodiskqueue.sync.QueueGroup) feeding an asyncio consumer."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from aiodiskqueue import DiskQueueError, QueueGroup, RoleError
from aiodiskqueue.sync import QueueGroup as SyncQueueGroup

REPO = Path(__file__).resolve().parent.parent

WORKER = """
import sys
sys.path.insert(0, {repo!r})
from aiodiskqueue.sync import QueueGroup
with QueueGroup({d!r}, "jobs") as g:
    for k in range(50):
        g.put(b"%s:%d" % (sys.argv[1].encode(), k))
    print(g.shard, flush=True)
"""


async def _drain(d: Path, n: int) -> list[bytes]:
    async with QueueGroup(d, "jobs", "consumer") as c:
        return [await asyncio.wait_for(c.get(), 20.0) for _ in range(n)]


async def test_wsgi_worker_processes_feed_an_asyncio_consumer(tmp_path: Path) -> None:
    code = WORKER.format(repo=str(REPO), d=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", code, f"w{i}"], stdout=subprocess.PIPE)
             for i in range(3)]
    outs = [p.communicate(timeout=60)[0].decode().strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) <= 3 and all(o.isdigit() for o in outs)
    got = await _drain(tmp_path, 150)
    for i in range(3):
        # FIFO per shard: each worker's messages come in its order.
        mine = [m for m in got if m.startswith(b"w%d:" % i)]
        assert mine == [b"w%d:%d" % (i, k) for k in range(50)]


async def test_threads_of_two_workers_put_at_once(tmp_path: Path) -> None:
    def work() -> None:
        with SyncQueueGroup(tmp_path, "jobs", sync_every=1) as g:
            def put_some(t: int) -> None:
                for k in range(20):
                    g.put(b"%s-%d-%d" % (g.shard.encode(), t, k))
            threads = [threading.Thread(target=put_some, args=(t,)) for t in range(4)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            g.put_many([b"last"])
            g.sync()
            assert g.qsize() >= 1
            assert g.name == "jobs" and g.directory == str(tmp_path)

    a, b = threading.Thread(target=work), threading.Thread(target=work)
    a.start()
    b.start()
    await asyncio.to_thread(a.join)
    await asyncio.to_thread(b.join)
    got = await _drain(tmp_path, 162)
    assert got.count(b"last") == 2


# Python 3.12+ warns of fork() beside threads: this test forks beside the loop thread
# on purpose (the child only checks and exits).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_process_must_open_its_own(tmp_path: Path) -> None:
    g = SyncQueueGroup(tmp_path, "jobs")
    try:
        g.put(b"parent")
        pid = os.fork()
        if pid == 0:  # the child: the parent's group is not its own
            code = 1
            try:
                g.put(b"child")
            except DiskQueueError as exc:
                code = 0 if "open it in each worker after the fork" in str(exc) else 2
            g.close()  # forgets, touches nothing of the parent's
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        g.put(b"parent again")
    finally:
        g.close()
    assert g.closed
    assert asyncio.run(_drain(tmp_path, 2)) == [b"parent", b"parent again"]


def test_the_sync_group_is_a_producer(tmp_path: Path) -> None:
    with SyncQueueGroup(tmp_path, "jobs") as g:
        assert g.shard == "000000"
        with pytest.raises(RoleError):
            asyncio.run_coroutine_threadsafe(g.group.get(), g._runner.loop).result()
    with pytest.raises(TypeError):
        SyncQueueGroup(tmp_path, "jobs", no_such_option=1)


def test_the_sync_group_counts_as_queue_queue_does(tmp_path: Path) -> None:
    # qsize(), empty() and full() and maxsize, as queue.Queue and the sync DiskQueue.
    with SyncQueueGroup(tmp_path, "jobs", maxsize=2) as g:
        assert (g.qsize(), g.empty(), g.full(), g.maxsize) == (0, True, False, 2)
        g.put_many([b"1", b"2"])
        assert (g.qsize(), g.empty(), g.full()) == (2, False, True)

"""The public surface of the core: statistics name the write path, errors form one tree."""

from __future__ import annotations

import asyncio
import inspect
import logging
from pathlib import Path

import pytest

import aiodiskqueue
from aiodiskqueue import DiskQueue, errors
from aiodiskqueue._core import lane


@pytest.mark.parametrize("pure", [False, True], ids=["default", "pure-python"])
async def test_statistics_and_log_name_the_write_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    pure: bool,
) -> None:
    monkeypatch.setenv("AIODISKQUEUE_PURE_PYTHON", "1" if pure else "0")
    expected = "native" if lane.available() else "python"
    assert expected == ("python" if pure else "native" if lane.Writer else "python")
    with caplog.at_level(logging.DEBUG, logger="aiodiskqueue"):
        async with DiskQueue(tmp_path, "q") as q:
            await q.put(b"x")
            assert q.statistics().write_path == expected
    opened = [r.getMessage() for r in caplog.records if "write path" in r.getMessage()]
    assert len(opened) == 1
    assert ("native write lane" if expected == "native" else "Python I/O thread") in opened[0]


def test_every_exception_is_a_diskqueueerror_and_exported() -> None:
    classes = {name: obj for name, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, BaseException)
               and obj.__module__ == errors.__name__}
    assert set(classes) == set(errors.__all__)
    for name, cls in classes.items():
        assert issubclass(cls, errors.DiskQueueError), name
        assert getattr(aiodiskqueue, name) is cls, f"aiodiskqueue.{name} is not exported"


def test_queue_not_found_is_a_lookup_error() -> None:
    err = errors.QueueNotFound("/d", "q")
    assert isinstance(err, LookupError) and isinstance(err, errors.DiskQueueError)
    assert str(err) == "no queue named 'q' in /d"


async def test_queue_closed_is_asyncio_queue_shutdown_where_it_exists(tmp_path: Path) -> None:
    shutdown_cls = getattr(asyncio, "QueueShutDown", None)
    q = await DiskQueue.open(tmp_path, "q")
    q.shutdown()
    with pytest.raises(errors.QueueClosed) as info:
        await q.put(b"x")
    await q.aclose()
    # On 3.13+ code written for asyncio.Queue.shutdown() catches ours; before, nothing to be.
    if shutdown_cls is not None:
        assert isinstance(info.value, shutdown_cls)
    else:
        assert errors.QueueClosed.__mro__[1:3] == (errors.DiskQueueError, Exception)

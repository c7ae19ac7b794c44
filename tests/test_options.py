"""Option defaults have one owner: DiskQueue, AckQueue and the broker read the same values."""

from __future__ import annotations

import dataclasses
import inspect

from aiodiskqueue import AckQueue, DiskQueue
from aiodiskqueue._core.options import DEFAULTS
from aiodiskqueue.ack.options import ACK_DEFAULTS
from aiodiskqueue.broker import BrokerOptions


def _defaults(fn: object) -> dict[str, object]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return {n: p.default for n, p in sig.parameters.items()
            if p.default is not inspect.Parameter.empty}


def test_diskqueue_and_ackqueue_take_every_core_option_with_its_default() -> None:
    core = dataclasses.asdict(DEFAULTS)
    for cls in (DiskQueue, AckQueue):
        got = _defaults(cls.__init__)
        assert {k: got[k] for k in core} == core, cls.__name__


def test_ackqueue_reads_the_reliable_delivery_defaults() -> None:
    got = _defaults(AckQueue.__init__)
    for k, v in dataclasses.asdict(ACK_DEFAULTS).items():
        assert got[k] == v, k


def test_broker_defaults_are_the_queue_defaults() -> None:
    b = BrokerOptions()
    assert (b.max_msg_size, b.sync_every, b.sync_interval, b.max_bytes_per_file) == (
        DEFAULTS.max_msg_size, DEFAULTS.sync_every, DEFAULTS.sync_interval,
        DEFAULTS.max_bytes_per_file)
    assert (b.msg_timeout, b.max_msg_timeout, b.max_req_timeout, b.max_attempts) == (
        ACK_DEFAULTS.msg_timeout, ACK_DEFAULTS.max_msg_timeout, ACK_DEFAULTS.max_delay,
        ACK_DEFAULTS.max_attempts)


def test_spark_defaults_are_the_queue_defaults() -> None:
    from aiodiskqueue.spark._options import SourceOptions

    o = SourceOptions(path="/d", name="q")
    assert (o.min_msg_size, o.max_msg_size, o.max_bytes_per_file) == (
        DEFAULTS.min_msg_size, DEFAULTS.max_msg_size, DEFAULTS.max_bytes_per_file)

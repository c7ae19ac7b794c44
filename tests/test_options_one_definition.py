"""Each queue option is defined once: the ``Options`` and ``AckDefaults`` dataclasses.

The queues' keyword parameters are their fields, with their defaults (checked here, as
they must be written out for type checkers and ``help()``); the checks and the
AckQueue's data and dead-letter queues derive from them; ``max_items`` is checked by
one function.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from aiodiskqueue import AckQueue, DiskQueue
from aiodiskqueue._core.options import DEFAULTS, Options
from aiodiskqueue.ack.options import ACK_DEFAULTS, AckOptions

CORE = {f.name: f for f in dataclasses.fields(Options)}
ACK = {f.name: f for f in dataclasses.fields(AckOptions) if f.name != "core"}


def _keyword_defaults(cls: type) -> dict[str, object]:
    return {n: p.default for n, p in inspect.signature(cls).parameters.items()
            if p.kind is p.KEYWORD_ONLY}


def test_the_option_names_are_the_dataclass_fields() -> None:
    assert set(CORE) == Options.NAMES
    assert set(CORE) | set(ACK) == AckOptions.NAMES


def test_the_keyword_parameters_are_the_options_with_their_defaults() -> None:
    assert _keyword_defaults(DiskQueue) == dataclasses.asdict(DEFAULTS)
    ack = _keyword_defaults(AckQueue)
    assert ack.pop("clock") is None
    want = {**dataclasses.asdict(ACK_DEFAULTS), "format": "raw", **dataclasses.asdict(DEFAULTS)}
    assert ack == want
    assert AckOptions().format == "raw"


@pytest.mark.parametrize("cls", [DiskQueue, AckQueue], ids=lambda c: c.__name__)
def test_an_unknown_option_is_refused_by_name(tmp_path: Path, cls: Any) -> None:
    # Python 3.13 adds "Did you mean 'sync_every'?" to the interpreter's own message.
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\.__init__\(\) got an unexpected "
                                        r"keyword argument 'syncevery'(\. Did you mean "
                                        r"'sync_every'\?)?$"):
        cls(tmp_path, "q", syncevery=1)
    with pytest.raises(TypeError, match=r"^AckQueue\(\) got an unexpected keyword argument "
                                        r"'syncevery'$"):
        AckOptions.from_keywords("AckQueue", {"syncevery": 1})


@pytest.mark.parametrize(("option", "value", "error"), [
    ("max_msg_size", -1, ValueError),
    ("sync_every", "1", TypeError),
    ("strict", 1, TypeError),
], ids=["max_msg_size", "sync_every", "strict"])
def test_a_bad_core_option_gets_the_same_error_from_both_queues(
        tmp_path: Path, option: str, value: object, error: type[Exception]) -> None:
    bad: dict[str, Any] = {option: value}
    with pytest.raises(error) as core:
        DiskQueue(tmp_path, "q", **bad)
    with pytest.raises(error) as ack:
        AckQueue(tmp_path, "q", **bad)
    assert str(core.value) == str(ack.value)
    assert option in str(core.value)


def test_the_data_and_dead_letter_queues_derive_their_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: dict[str, Options] = {}
    real = DiskQueue._with_options

    def spy(directory: Any, name: str, opts: Options, role: str = "both") -> DiskQueue:
        made[str(directory)] = opts
        return real(directory, name, opts, role)

    monkeypatch.setattr(DiskQueue, "_with_options", spy)
    AckQueue(tmp_path, "q", format="nsq", max_attempts=3, max_bytes_per_file=4096,
             strict=True, maxsize=7, sync_every=5, spin_us=0)
    data = made[str(tmp_path)]
    dead = made[str(tmp_path / "q.dead-letters")]
    for o in (data, dead):
        assert (o.max_bytes_per_file, o.strict, o.spin_us, o.min_msg_size) == (
            4096, True, 0, 26)  # nsqd's header is the smallest payload
    assert (data.maxsize, dead.maxsize) == (7, 0)
    assert dead.sync_every == 5
    assert data.sync_every > 2**60  # the data queue stores its position in commits only
    assert dataclasses.replace(data, sync_every=5, sync_interval=DEFAULTS.sync_interval,
                               maxsize=0) == dead


async def _get_many(q: DiskQueue | AckQueue, n: Any) -> None:
    await q.get_many(n)


@pytest.mark.parametrize(("value", "error", "message"), [
    (0, ValueError, "max_items must be >= 1, got 0"),
    (-3, ValueError, "max_items must be >= 1, got -3"),
    (True, TypeError, "max_items must be an int, got bool"),
    (2.0, TypeError, "max_items must be an int, got float"),
], ids=["zero", "negative", "bool", "float"])
async def test_max_items_is_checked_once_with_one_message(
        tmp_path: Path, value: Any, error: type[Exception], message: str) -> None:
    async with DiskQueue(tmp_path, "d") as dq, AckQueue(tmp_path, "a") as aq:
        for q in (dq, aq):
            with pytest.raises(error) as info:
                await _get_many(q, value)
            assert str(info.value) == message
        with pytest.raises(error) as info:
            aq.get_many_nowait(value)
        assert str(info.value) == message


def test_checked_options_open_a_queue_with_the_same_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    o = AckOptions.from_keywords("BrokerOptions", {"max_attempts": 2, "sync_every": 7,
                                                    "msg_timeout": 5})
    assert AckOptions.from_keywords("again", o.keywords()) == o
    assert o.msg_timeout == 5.0 and isinstance(o.msg_timeout, float)
    assert Options.from_keywords("again", o.core.keywords()) == o.core
    AckQueue(tmp_path, "q", **o.keywords())
    DiskQueue(tmp_path, "d", **o.core.keywords())

"""The main demo (``bash dev.sh demo``) without Spark, with small numbers: the crash and
restart steps and the two-process step, whose checks the demo prints; and that step's
checks catching a lost message, a message out of order and a duplicate the contract
does not allow."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"


def _demo_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("aiodiskqueue_demo", DEMO)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # 2-10 s here (more on a loaded machine): five child processes, three SIGKILLs
def test_demo_runs_and_its_checks_hold(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(DEMO), "--data-dir", str(tmp_path), "--no-spark",
         "--messages", "2000", "--role-messages", "2000", "--sync-takes", "500"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "== 4. one queue, two processes: a producer and a consumer at once, each killed once" \
        in lines
    assert any(x.startswith("SIGKILL producer: it had acknowledged numbers 0..") for x in lines)
    assert any(x.startswith("SIGKILL consumer: it had taken ") for x in lines)
    assert any(x.startswith("producer stopped cleanly (SIGTERM) after number ") for x in lines)
    assert any(x.startswith("checked: all ") and x.endswith(" acknowledged puts were delivered")
               for x in lines)
    assert "checked: in put order, in each consumer run and across the restart" in lines
    assert lines[-1].startswith("OK: ")
    assert "producer and consumer each killed once: none lost, in order," in lines[-1]


def _runs(**changes: Any) -> dict[str, Any]:
    """Step 4's outputs as they come from a good run: producer run 1 acknowledged 0..5
    (6 landed), run 2 acknowledged 6..9; consumer run 1 took 0..7 and synced after 4,
    consumer run 2 took 5..9 (5, 6 and 7 delivered twice)."""
    p1 = [(1, i) for i in range(6)]
    p2 = [(2, i) for i in range(6, 10)]
    took1 = [*p1, (1, 6), (2, 6), (2, 7)]
    runs = {
        "p1": SimpleNamespace(what="producer run 1", acked=p1, took=[], durable=None),
        "p2": SimpleNamespace(what="producer run 2", acked=p2, took=[], durable=None),
        "c1": SimpleNamespace(what="consumer run 1", acked=[], took=took1, durable=(1, 4)),
        "c2": SimpleNamespace(what="consumer run 2", acked=[],
                              took=[(1, 5), (1, 6), (2, 6), (2, 7), (2, 8), (2, 9)],
                              durable=None),
        "left": 0,
    }
    runs.update(changes)
    return runs


def test_checks_pass_a_good_run(capsys: pytest.CaptureFixture[str]) -> None:
    verdict = _demo_module().check_two_processes(**_runs())
    assert verdict == ("OK: 10 acknowledged puts, producer and consumer each killed once: "
                       "none lost, in order, 4 duplicates, all allowed")
    assert "note: 1 put(s) of the killed producer landed but were not yet acknowledged" \
        in capsys.readouterr().out


def _c2(took: list[tuple[int, int]]) -> SimpleNamespace:
    return SimpleNamespace(what="consumer run 2", acked=[], took=took, durable=None)


@pytest.mark.parametrize(("changes", "message"), [
    pytest.param({"c2": _c2([(1, 5), (1, 6), (2, 6), (2, 7), (2, 8)])},
                 "CHECK FAILED: 1 acknowledged puts never delivered, first number 9 of "
                 "producer run 2", id="lost"),
    pytest.param({"c2": _c2([(1, 5), (1, 6), (2, 6), (2, 7), (2, 9), (2, 8)])},
                 "CHECK FAILED: consumer run 2 got messages out of put order", id="order"),
    pytest.param({"c1": SimpleNamespace(what="consumer run 1", acked=[], durable=(1, 2),
                                        took=[(1, 0), (1, 1), (1, 2), (1, 4), (1, 5)]),
                  "c2": _c2([(1, 3), (1, 4), (1, 5), (1, 6), (2, 6), (2, 7), (2, 8), (2, 9)])},
                 "CHECK FAILED: first deliveries out of put order across the consumer restart",
                 id="order-across-restart"),
    pytest.param({"c2": _c2([(1, 3), (1, 4), (1, 5), (1, 6), (2, 6), (2, 7), (2, 8), (2, 9)])},
                 "CHECK FAILED: a message taken before the consumer's last durable position "
                 "came again", id="duplicate-before-durable"),
    pytest.param({"left": 2}, "CHECK FAILED: 2 messages left in the queue after the drain",
                 id="left"),
])
def test_checks_catch_a_bad_run(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
        _demo_module().check_two_processes(**_runs(**changes))

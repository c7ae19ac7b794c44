"""bench/ab.py: the suite on an earlier revision and on this checkout, compared pair by pair.

No speed is asserted: these check the pairing, the statistics and that each side really
runs its own tree.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
AB = REPO / "bench" / "ab.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_ab", AB)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


ab = _load()


def _row(workload: str, rate: float, cpu: float | None = 1.0, system: str = "aiodiskqueue",
         producers: int = 1) -> dict[str, Any]:
    return {"workload": workload, "producers": producers, "size": 1024, "system": system,
            "loop": "uvloop", "rate_median": rate, "cpu_us_per_msg": cpu}


def _run(*rows: dict[str, Any], native: bool = True) -> dict[str, Any]:
    return {"meta": {"native_writer": native, "duration_s": 1.0}, "rows": list(rows)}


def test_sign_test_gives_the_binomial_two_sided_p_value() -> None:
    assert ab.sign_test(6, 6) == pytest.approx(2 / 64)
    assert ab.sign_test(0, 6) == pytest.approx(2 / 64)
    assert ab.sign_test(5, 6) == pytest.approx(2 * 7 / 64)
    assert ab.sign_test(3, 6) == 1.0
    assert ab.sign_test(0, 0) == 1.0


def test_compare_pairs_the_runs_in_order_and_keeps_rows_every_run_has() -> None:
    base = [_run(_row("put", 100.0, 10.0), _row("drain", 50.0)),
            _run(_row("put", 200.0, 20.0), _row("drain", 50.0))]
    head = [_run(_row("put", 150.0, 5.0), _row("drain", 50.0), _row("get_many", 9.0)),
            _run(_row("put", 180.0, 10.0))]
    rows = {c.key[0]: c for c in ab.compare(base, head)}
    assert set(rows) == {"put"}  # drain is missing from one run, get_many from the base
    put = rows["put"]
    assert put.rate_ratios == pytest.approx([1.5, 0.9])  # pair by pair, not sorted
    assert put.ahead == (1, 2)
    assert (put.base_rate, put.head_rate) == (150.0, 165.0)
    assert put.cpu_ratios == pytest.approx([0.5, 0.5])
    assert (put.base_cpu, put.head_cpu) == (15.0, 7.5)


def test_compare_drops_ties_from_the_count_and_tolerates_rows_without_cpu() -> None:
    base = [_run(_row("put", 100.0, None)) for _ in range(3)]
    head = [_run(_row("put", r, None)) for r in (100.0, 120.0, 130.0)]
    (put,) = ab.compare(base, head)
    assert put.ahead == (2, 2)
    assert put.p == 0.5
    assert put.cpu_ratios == [] and put.base_cpu is None
    assert "put" in ab.format_table([put], "a", "b")


def test_compare_needs_as_many_runs_on_each_side() -> None:
    with pytest.raises(ab.ABError):
        ab.compare([_run(_row("put", 1.0))], [])


def test_a_native_run_is_not_compared_with_a_pure_python_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    base = ab.Side("base", tmp_path, tmp_path / "run.py")
    head = ab.Side("head", REPO, REPO / "bench" / "run.py")

    def fake_run(side: Any, run_args: Any, out: Path) -> dict[str, Any]:
        return _run(_row("put", 1.0), native=side is head)

    monkeypatch.setattr(ab, "run_once", fake_run)
    with pytest.raises(ab.ABError, match="native writer"):
        ab.run_pairs(base, head, 3, [], tmp_path, say=lambda m: None)
    assert len(base.runs) == len(head.runs) == 1  # it stopped after the first pair


def test_queues_on_different_filesystems_are_not_compared(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    base = ab.Side("base", tmp_path, tmp_path / "run.py")
    head = ab.Side("head", REPO, REPO / "bench" / "run.py")

    def fake_run(side: Any, run_args: Any, out: Path) -> dict[str, Any]:
        doc = _run(_row("put", 1.0))
        doc["meta"]["machine"] = {"tmp_fs": "ext4" if side is head else "tmpfs"}
        return doc

    monkeypatch.setattr(ab, "run_once", fake_run)
    with pytest.raises(ab.ABError, match="different filesystems"):
        ab.run_pairs(base, head, 2, [], tmp_path, say=lambda m: None)


def test_a_row_whose_check_failed_is_not_compared() -> None:
    bad = dict(_row("drain", 0.0), verified=False)
    base = [_run(_row("put", 100.0), _row("drain", 50.0))]
    head = [_run(_row("put", 110.0), bad)]
    assert [c.key[0] for c in ab.compare(base, head)] == ["put"]


def _ab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(AB), *args], capture_output=True, text=True,
                          timeout=600, cwd=REPO, check=False)


def _worktrees() -> str:
    return subprocess.run(["git", "-C", str(REPO), "worktree", "list", "--porcelain"],
                          capture_output=True, text=True, check=True).stdout


# The wheel session runs a copy of the tests outside any git checkout; ab.py is a tool of
# the checkout, and the main suite (a clone) runs these.
needs_git = pytest.mark.skipif(not (REPO / ".git").exists(),
                               reason="needs a git checkout of the project")


@needs_git
def test_an_unknown_revision_fails_clearly_and_leaves_no_worktree() -> None:
    before = _worktrees()
    proc = _ab("no-such-revision-anywhere", "--pairs", "1")
    assert proc.returncode == 2
    assert "ab: git rev-parse" in proc.stderr
    assert _worktrees() == before


def test_out_is_refused_in_the_run_arguments() -> None:
    proc = _ab("HEAD", "--", "--out", "x.json")
    assert proc.returncode == 2 and "--out is set by ab.py" in proc.stderr


# slow: it compiles the native writer and runs the suite twice (a few seconds); the matrix
# sessions, whose interpreter differs from the checkout's build, leave it to the main run.
@pytest.mark.slow
@needs_git
def test_head_against_itself_runs_each_side_from_its_own_tree(tmp_path: Path) -> None:
    before = _worktrees()
    out = tmp_path / "ab.json"
    proc = _ab("HEAD", "--pairs", "1", "--json", str(out), "--", "--quick", "--reps", "1",
               "--sizes", "64", "--messages", "2000", "--only", "put", "--producers", "1",
               "--systems", "ours", "--loop", "asyncio", "--tmpdir", str(tmp_path / "q"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["key"] == ["put", 1, 64, "aiodiskqueue", "asyncio"]
    assert len(row["rate_ratios"]) == 1 and row["rate_ratios"][0] > 0
    assert "put" in proc.stdout and "ratio" in proc.stdout
    assert _worktrees() == before  # the base's worktree is gone again

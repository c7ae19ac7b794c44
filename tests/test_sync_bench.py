"""Smoke test of ``bench/bench_sync.py``: it runs, checks every message, and prints its table.

No speed is asserted: the figures are evidence for the README, not test outcomes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_bench_sync_prints_every_row_with_a_ratio() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_sync.py"), "--n", "320",
         "--n-durable", "160", "--n-peer", "160", "--reps", "1"],
        capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["system", "level", "puts/s", "min-max", "cpu", "vs", "peer"]
    rows = lines[2:-1]
    systems = [r[:48].strip() for r in rows]
    assert systems[:2] == ["persist-queue Queue", "persist-queue SQLiteQueue (multithreading)"]
    assert "sync.DiskQueue, asyncio" in systems
    assert "sync.DiskQueue sync_every=1, asyncio" in systems
    for r in rows:
        assert r.endswith("x") and float(r.split()[-1].removesuffix("x")) > 0
    assert rows[0].endswith(" 1.0x") and rows[1].endswith(" 1.0x")  # the anchors
    assert "every repetition passed its exactly-once, in-order check" in lines[-1]

"""bench/report.py: the results table and plot of a benchmark run, out of the installed CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO_ROOT as REPO

FAKE_RUN = textwrap.dedent("""
    import json, os, sys
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(os.path.join(here, "results"), exist_ok=True)
    quick = "--quick" in sys.argv
    rows = []
    for system, base in (("aiodiskqueue", 300000.0), ("go-diskqueue", 400000.0)):
        for size in (16, 1024, 65536):
            for producers in (1, 16):
                rate = base / (1 + size / 4096) * (1.2 if producers > 1 else 1.0)
                rows.append({"workload": "put", "system": system, "size": size,
                             "producers": producers, "loop": "asyncio",
                             "rate_median": rate, "rate_min": rate * 0.9,
                             "rate_max": rate * 1.1,
                             "guarantee": "quick" if quick else "full",
                             "argv": sys.argv[1:]})
    with open(os.path.join(here, "results", "latest.json"), "w") as f:
        json.dump(rows, f)
    print("benchmarks done")
""")


def report(script: Path, *args: object) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300, check=False)


@pytest.fixture
def fake_bench(tmp_path: Path) -> Path:
    """A bench folder holding the real report.py beside a fake run.py."""
    d = tmp_path / "bench"
    d.mkdir()
    (d / "run.py").write_text(FAKE_RUN)
    shutil.copy(REPO / "bench" / "report.py", d / "report.py")
    return d / "report.py"


def test_report_runs_the_suite_and_prints_the_table(fake_bench: Path) -> None:
    res = report(fake_bench, "--run", "--", "--quick")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["workload", "system", "size", "producers", "loop",
                                "rate_median", "rate_min", "rate_max", "guarantee"]
    assert len(lines) == 1 + 12
    rate = 300000.0 / (1 + 16 / 4096)
    assert lines[1].split() == ["put", "aiodiskqueue", "16", "1", "asyncio", f"{rate:,.0f}",
                                f"{rate * 0.9:,.0f}", f"{rate * 1.1:,.0f}", "quick"]
    assert "benchmarks done" in res.stderr  # the suite's own output stays off stdout


def test_report_plot_writes_a_png(fake_bench: Path, tmp_path: Path) -> None:
    out = tmp_path / "chart.png"
    res = report(fake_bench, "--run", "--plot", out)
    assert res.returncode == 0, res.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_report_json_from_existing_results(fake_bench: Path) -> None:
    assert report(fake_bench, "--run").returncode == 0
    res = report(fake_bench, "--results", fake_bench.parent / "results" / "latest.json",
                 "--json")
    rows = json.loads(res.stdout)
    assert len(rows) == 12 and rows[0]["guarantee"] == "full"


def test_report_passes_further_arguments_to_the_suite(fake_bench: Path) -> None:
    res = report(fake_bench, "--run", "--json", "--", "--only", "put")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)[0]["argv"] == ["--only", "put"]


def test_report_without_results_fails_clearly(tmp_path: Path) -> None:
    res = report(REPO / "bench" / "report.py", "--results", tmp_path / "none.json")
    assert res.returncode == 2
    assert "no benchmark results at" in res.stderr and res.stdout == ""


def test_report_runs_the_real_suite(tmp_path: Path) -> None:
    out = tmp_path / "latest.json"
    chart = tmp_path / "chart.png"
    res = report(REPO / "bench" / "report.py", "--run", "--results", out, "--plot", chart,
                 "--", "--quick", "--only", "put", "--systems", "ours", "--sizes", "64,1024",
                 "--reps", "1", "--loop", "asyncio", "--messages", "1000")
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["size"] for r in rows} == {64, 1024}
    for r in rows:
        assert {"workload", "system", "size", "producers", "loop", "rate_median", "rate_min",
                "rate_max", "guarantee"} <= set(r)
    assert len(res.stdout.splitlines()) == 1 + len(rows)
    assert chart.read_bytes()[:4] == b"\x89PNG"

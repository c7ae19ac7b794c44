"""Print (and plot) the results table of a benchmark run.

    python bench/report.py                         # bench/results/latest.json as a table
    python bench/report.py --run -- --quick        # run bench/run.py first (args after --)
    python bench/report.py --results R.json --json --plot chart.png

The table has one row per measured row of ``bench/run.py``; ``--plot`` draws the
median throughput against message size and against producer count (needs
matplotlib, the ``bench`` extra). Exit status: 0, 1 if the suite's correctness
check failed (the results are still printed), 2 on a usage or file error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


class ReportError(Exception):
    """An error reported as one line on stderr, exit status 2."""


_BENCH_KEYS = ("workload", "system", "size", "producers", "loop", "rate_median", "rate_min",
               "rate_max", "guarantee")


def _load_rows(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ReportError(f"no benchmark results at {path}") from None
    except ValueError as exc:
        raise ReportError(f"cannot parse benchmark results {path}: {exc}") from None
    rows = data.get("rows", []) if isinstance(data, dict) else data
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ReportError(f"{path}: expected a JSON list of objects")
    return rows


def _fmt_cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"
    return "-" if v is None else str(v)


def plot_bench(rows: list[dict[str, Any]], out_png: str) -> None:
    """Draw median throughput against message size and against producer count.

    Raises ReportError if matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReportError("--plot needs matplotlib: pip install matplotlib") from None
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if isinstance(r.get("rate_median"), (int, float)):
            series.setdefault((str(r.get("system")), str(r.get("workload"))), []).append(r)
    fig, (ax_size, ax_prod) = plt.subplots(1, 2, figsize=(12, 5))
    for (system, workload), rs in sorted(series.items()):
        label = f"{system} {workload}"
        prods: list[int] = [r["producers"] for r in rs if isinstance(r.get("producers"), int)]
        one = min(prods) if prods else None
        by_size = sorted((r["size"], r["rate_median"]) for r in rs
                         if r.get("producers") == one and isinstance(r.get("size"), int))
        if by_size:
            ax_size.plot([x for x, _ in by_size], [y for _, y in by_size], marker="o",
                         label=label)
        sizes: list[int] = [r["size"] for r in rs if isinstance(r.get("size"), int)]
        # 1 KiB is the project's reference size; otherwise the size measured most often.
        common = 1024 if 1024 in sizes else (max(sorted(set(sizes)), key=sizes.count)
                                             if sizes else None)
        by_prod = sorted((r["producers"], r["rate_median"]) for r in rs
                         if r.get("size") == common and isinstance(r.get("producers"), int))
        if len(by_prod) > 1:
            ax_prod.plot([x for x, _ in by_prod], [y for _, y in by_prod], marker="o",
                         label=f"{label} ({common} B)")
    ax_size.set(xscale="log", yscale="log", xlabel="message size (bytes)",
                ylabel="messages/s (median)", title="throughput vs message size")
    ax_prod.set(xscale="log", yscale="log", xlabel="producers",
                ylabel="messages/s (median)", title="throughput vs producers")
    for ax in (ax_size, ax_prod):
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def print_table(rows: list[list[str]], right: frozenset[int]) -> None:
    """Print ``rows`` (the first is the header) as columns; those in ``right`` right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        sys.stdout.write("  ".join(cells).rstrip() + "\n")


def run_suite(results: str | None, extra: list[str]) -> int:
    """Run bench/run.py beside this file with ``extra`` arguments; its output goes to stderr.

    Returns 0, or 1 if the suite failed a check but wrote fresh results.
    Raises ReportError if it failed without writing them.
    """
    script = os.path.join(HERE, "run.py")
    cmd = [sys.executable, script, *extra] + (["--out", results] if results else [])
    started = time.time()
    proc = subprocess.run(cmd, cwd=os.path.dirname(HERE), stdout=sys.stderr, check=False)
    if proc.returncode == 0:
        return 0
    path = results or os.path.join(HERE, "results", "latest.json")
    if not (os.path.isfile(path) and os.stat(path).st_mtime >= started - 1):
        raise ReportError(f"{script} failed with exit code {proc.returncode}")
    sys.stderr.write(f"report: {script} exited with {proc.returncode} (a check failed); "
                     "results follow\n")
    return 1


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="store_true", help="run bench/run.py first")
    p.add_argument("--results", metavar="PATH",
                   help="results file (default bench/results/latest.json)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--plot", metavar="PNG", help="also draw the rows into this PNG file")
    p.add_argument("suite_args", nargs=argparse.REMAINDER,
                   help="with --run: arguments for bench/run.py after --")
    args = p.parse_args(argv)
    try:
        status = 0
        if args.run:
            extra = list(args.suite_args)
            status = run_suite(args.results, extra[1:] if extra[:1] == ["--"] else extra)
        elif args.suite_args:
            raise ReportError("arguments after -- go to bench/run.py and need --run")
        rows = _load_rows(args.results or os.path.join(HERE, "results", "latest.json"))
        if args.json:
            sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        elif rows:
            table = [list(_BENCH_KEYS)]
            table += [[_fmt_cell(r.get(k)) for k in _BENCH_KEYS] for r in rows]
            print_table(table, right=frozenset({2, 3, 5, 6, 7}))
        if args.plot:
            plot_bench(rows, args.plot)
            sys.stderr.write(f"report: wrote {args.plot}\n")
        return status
    except ReportError as exc:
        sys.stderr.write(f"report: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

"""The README's short performance table, side by side with the peers, measured afresh.

Runs ``bench/run.py`` once for 1 KiB messages on one event loop (ours, the raw baseline
and every installed peer, interleaved in the same run), then prints the README's table as
markdown: our rate and CPU per message for each workload, the fastest peer with at least
our crash guarantee and queuelib (no crash guarantee) with their ratios, all from that
run, and go-diskqueue's figures as recorded in ``bench/README.md`` (measured separately:
no Go toolchain runs here). A caption line says when, on which revision and at what
machine load it ran.

    python bench/readme_table.py                  # the full run: several minutes
    python bench/readme_table.py --small          # a smoke run: seconds, figures meaningless
    python bench/readme_table.py --from-json R    # the table of an earlier run.py JSON

Exit status: 0, 1 if a correctness check of the run failed, 2 on bad usage or when
``run.py`` itself failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
OURS = "aiodiskqueue"
QUEUELIB = "queuelib FifoDiskQueue"
SIZE = 1024

#: (workload, producers, label) in the README's order.
ROWS: tuple[tuple[str, int, str], ...] = (
    ("put", 1, "`put`, 1 producer task"),
    ("put", 16, "`put`, 16 producer tasks"),
    ("put_many", 1, "`put_many` (batches of 1,000)"),
    ("drain", 1, "drain with `async for`"),
    ("get_many", 1, "`get_many(1000)`"),
    ("durable", 1, "durable (`sync_every=1`), 1 producer"),
    ("durable", 16, "durable, 16 producers"),
    ("durable", 64, "durable, 64 producers"),
)

#: Row of bench/README.md's go-diskqueue table -> (workload, producers) it stands beside.
GO_ROWS = {
    "put, 1 producer": ("put", 1),
    "put, 16 goroutines": ("put", 16),
    "drain": ("drain", 1),
    "`syncEvery=1`": ("durable", 1),
}


def go_anchors(readme: Path) -> dict[tuple[str, int], str]:
    """go-diskqueue's 1 KiB figures from the "go-diskqueue on this machine" table of
    ``readme``, by the (workload, producers) row they stand beside; empty if not found."""
    try:
        text = readme.read_text()
    except OSError:
        return {}
    m = re.search(r"^## go-diskqueue on this machine\n(.*?)(?=^## )", text, re.S | re.M)
    if m is None:
        return {}
    out: dict[tuple[str, int], str] = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] in GO_ROWS:
            out[GO_ROWS[cells[0]]] = cells[1]
    return out


def fmt_rate(x: float) -> str:
    """A rate as ``812k/s`` or ``1.23M/s``."""
    if x >= 1e6:
        return f"{x / 1e6:.2f}M/s"
    if x >= 1e4:
        return f"{x / 1e3:.0f}k/s"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k/s"
    return f"{x:.0f}/s"


def fmt_ratio(x: float | None) -> str:
    """``0.66x``, ``9.2x`` or ``23x``; ``-`` for no ratio."""
    if x is None:
        return "-"
    if x < 1:
        return f"{x:.2f}x"
    return f"{x:.1f}x" if x < 10 else f"{x:.0f}x"


def table(data: dict[str, Any], go: dict[tuple[str, int], str]) -> str:
    """The README table (markdown) of one ``run.py`` JSON result, with its caption.

    Raises ValueError if the result holds none of our 1 KiB rows.
    """
    rows = data["rows"]
    ours = {(r["workload"], r["producers"]): r for r in rows
            if r["system"] == OURS and r["size"] == SIZE}
    if not ours:
        raise ValueError(f"no {OURS} rows of {SIZE} B in the result")
    by_system = {(r["workload"], r["producers"], r["system"]): r for r in rows
                 if r["size"] == SIZE}
    lines = [
        "| workload | aiodiskqueue | CPU us/msg | best crash-safe peer | vs it "
        "| queuelib (no crash safety) | vs it | go-diskqueue (separate) |",
        "|---|--:|--:|---|--:|--:|--:|--:|",
    ]
    for workload, producers, label in ROWS:
        r = ours.get((workload, producers))
        if r is None:
            continue
        cpu = r.get("cpu_us_per_msg")
        best = r.get("best_peer")
        best_row = by_system.get((workload, producers, best)) if best else None
        peer = (f"{best} {fmt_rate(best_row['rate_median'])}"
                if best and best_row else "-")
        ql = by_system.get((workload, producers, QUEUELIB))
        if ql is None and workload == "put" and producers > 1:
            ql = by_system.get(("put", 1, QUEUELIB))  # not thread-safe: its single producer
        ql_rate = fmt_rate(ql["rate_median"]) if ql and r.get("ratio_queuelib") else "-"
        lines.append(
            f"| {label} | {fmt_rate(r['rate_median'])} | "
            f"{'-' if cpu is None else f'{cpu:.2f}' if cpu < 10 else f'{cpu:.1f}'} | "
            f"{peer} | {fmt_ratio(r.get('ratio_best_peer'))} | {ql_rate} | "
            f"{fmt_ratio(r.get('ratio_queuelib'))} | {go.get((workload, producers), '-')} |")
    return "\n".join(lines)


def caption(data: dict[str, Any], load: tuple[float, float] | None) -> str:
    """One line: when, which revision, loop, repetitions and the machine's load."""
    meta = data["meta"]
    loops = {r["loop"] for r in data["rows"] if r["system"] == OURS}
    cfg = meta.get("config", {})
    parts = [
        f"Measured {meta['timestamp']}",
        f"aiodiskqueue {meta['versions']['aiodiskqueue']}",
        f"{meta['machine']['cpus']} CPUs",
        f"Python {meta['python']}",
        f"{'/'.join(sorted(loops))}",
        f"{SIZE} B messages",
        f"medians of {cfg.get('reps', '?')}",
    ]
    if load is not None:
        parts.append(f"load average {load[0]:.1f} before, {load[1]:.1f} after")
    if cfg.get("quick"):
        parts.append("QUICK RUN: the figures mean nothing")
    return "; ".join(parts) + "."


def run_suite(args: argparse.Namespace, out: Path) -> tuple[int, tuple[float, float]]:
    """Run ``bench/run.py`` into ``out``; its exit status and the load before and after."""
    cmd = [sys.executable, str(BENCH_DIR / "run.py"), "--sizes", str(SIZE),
           "--loop", args.loop, "--out", str(out)]
    if args.small:
        cmd += ["--quick", "--reps", "1", "--messages", "2000"]
    if args.systems:
        cmd += ["--systems", args.systems]
    if args.tmpdir:
        cmd += ["--tmpdir", args.tmpdir]
    before = os.getloadavg()[0]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
    return proc.returncode, (before, os.getloadavg()[0])


def main(argv: Sequence[str] | None = None) -> int:
    """Measure (or read) a run and print the README's table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--small", action="store_true",
                    help="run.py --quick with one repetition of 2,000 messages (a smoke run)")
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop",
                    help="event loop of our rows (default uvloop)")
    ap.add_argument("--systems", default=None,
                    help="passed to run.py --systems (default: ours, raw and every peer)")
    ap.add_argument("--tmpdir", default=None, help="passed to run.py --tmpdir")
    ap.add_argument("--from-json", type=Path, default=None, metavar="PATH",
                    help="print the table of this run.py JSON instead of running")
    ap.add_argument("--json-out", type=Path, default=None, metavar="PATH",
                    help="keep the run's JSON here (default: a temporary file)")
    args = ap.parse_args(argv)
    if args.from_json is not None and (args.small or args.systems or args.json_out):
        ap.error("--from-json reads a finished run: no --small, --systems or --json-out")
    if args.loop == "uvloop" and args.from_json is None:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            ap.error("uvloop is not installed: pip install uvloop, or use --loop asyncio")
    load: tuple[float, float] | None = None
    status = 0
    with tempfile.TemporaryDirectory(prefix="readme-table-") as tmp:
        path = args.from_json
        if path is None:
            path = args.json_out or Path(tmp) / "results.json"
            status, load = run_suite(args, path)
            if status not in (0, 1):
                print(f"bench/run.py failed with exit status {status}", file=sys.stderr)
                return 2
        try:
            data = json.loads(path.read_text())
            text = table(data, go_anchors(BENCH_DIR / "README.md"))
        except (OSError, ValueError, KeyError) as exc:
            print(f"cannot make the table from {path}: {exc}", file=sys.stderr)
            return 2
    print(caption(data, load))
    print()
    print(text)
    print()
    print("Ratios are of the same run's medians; \"best crash-safe peer\" is the fastest peer "
          "with at least our crash guarantee (kill-safe rows: kill-safe or durable peers; "
          "durable rows: durable peers). queuelib is not thread-safe: 16 producers compare "
          "with its single one. go-diskqueue: recorded in bench/README.md, not this run.")
    if not data["meta"].get("all_verified", False):
        print("a correctness check failed: see run.py's table", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())

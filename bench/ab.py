"""A/B: the benchmark suite on an earlier revision and on this checkout, run after run.

On a shared 2-vCPU machine one run of ``bench/run.py`` differs from the next by more than
most changes are worth: the same tree gave 338k and 424k msgs/s for the drain in two runs.
So this script runs the *same harness* (this checkout's ``bench/``) against both trees,
alternating which goes first, and compares the runs pair by pair:

- each pair's ratio of medians, this checkout over the base (msgs/s and CPU per message);
- in how many pairs this checkout was ahead;
- a two-sided sign test over the pairs (6 pairs all one way: p = 0.03).

The anchors (the raw baseline, queuelib) run on both sides and did not change: their
ratios show how far the machine alone moved the figures while the pairs ran.

The base is checked out in a temporary git worktree, its native writer compiled there,
and this checkout's ``bench/`` copied beside it, so
that the harness imports the base's package. Both sides must load a native writer, or
neither: a run that compares the native lane with the Python I/O thread stops.

Both sides put their queues in ``bench/results/ab-queues`` (the repository's filesystem)
unless RUN_ARGS give ``--tmpdir``, and run from the repository's directory.

Usage: ``python bench/ab.py BASE [--pairs 6] [--json FILE] [--keep] [-- RUN_ARGS...]``,
e.g. ``python bench/ab.py HEAD~3 -- --only put --producers 1 --sizes 1024 --loop uvloop``.
Without RUN_ARGS: ``--sizes 1024 --loop uvloop --systems ours,raw,queuelib``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DEFAULT_RUN_ARGS = ("--sizes", "1024", "--loop", "uvloop", "--systems", "ours,raw,queuelib")
HARNESS = "_ab_bench"  # the copy of this checkout's bench/ inside the base's worktree

Key = tuple[str, int, int, str, str]
"""workload, producers, size, system, loop: one row of a run."""


class ABError(Exception):
    """The comparison cannot be made (bad revision, failed build or run, unlike sides)."""


@dataclass
class Side:
    """One tree under test: where its harness runs and what its runs gave."""

    name: str
    tree: Path
    script: Path
    runs: list[dict[str, Any]] = field(default_factory=list)


def sign_test(ahead: int, n: int) -> float:
    """Two-sided p-value of ``ahead`` of ``n`` untied pairs going one way if neither
    side were faster (each pair a fair coin)."""
    if n <= 0:
        return 1.0
    k = min(ahead, n - ahead)
    return min(1.0, 2.0 * sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n)


def row_key(row: dict[str, Any]) -> Key:
    """The identity of a row across runs."""
    return (row["workload"], int(row["producers"]), int(row["size"]), row["system"],
            row["loop"])


@dataclass(frozen=True)
class Compared:
    """One row's figures over the pairs: medians per side, per-pair ratios (head/base)."""

    key: Key
    base_rate: float
    head_rate: float
    rate_ratios: list[float]
    base_cpu: float | None
    head_cpu: float | None
    cpu_ratios: list[float]

    @property
    def ahead(self) -> tuple[int, int]:
        """(pairs in which head had the higher rate, untied pairs)."""
        untied = [r for r in self.rate_ratios if r != 1.0]
        return sum(r > 1.0 for r in untied), len(untied)

    @property
    def p(self) -> float:
        """The sign test's p-value over the pairs' rates."""
        return sign_test(*self.ahead)


def compare(base_runs: Sequence[dict[str, Any]],
            head_runs: Sequence[dict[str, Any]]) -> list[Compared]:
    """Pair the i-th run of each side and compare every row present in all of them and
    checked in all of them (a row whose order check failed has no rate to compare)."""
    if len(base_runs) != len(head_runs) or not base_runs:
        raise ABError("compare needs the same number of runs on each side, at least one")
    tables = [[{row_key(r): r for r in run["rows"]} for run in side]
              for side in (base_runs, head_runs)]
    keys = [k for k in tables[0][0] if all(k in t and t[k].get("verified", True)
                                            for side in tables for t in side)]
    out = []
    for k in keys:
        b = [t[k] for t in tables[0]]
        h = [t[k] for t in tables[1]]
        rate_ratios = [y["rate_median"] / x["rate_median"] for x, y in zip(b, h, strict=True)
                       if x["rate_median"] > 0]
        cpus = [(x.get("cpu_us_per_msg"), y.get("cpu_us_per_msg"))
                for x, y in zip(b, h, strict=True)]
        cpu_ratios = [y / x for x, y in cpus if x and y]
        out.append(Compared(
            key=k,
            base_rate=statistics.median(r["rate_median"] for r in b),
            head_rate=statistics.median(r["rate_median"] for r in h),
            rate_ratios=rate_ratios,
            base_cpu=_median_or_none([x for x, _ in cpus]),
            head_cpu=_median_or_none([y for _, y in cpus]),
            cpu_ratios=cpu_ratios,
        ))
    return out


def _median_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _rate(v: float) -> str:
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.0f}k" if v >= 1e3 else f"{v:.0f}"


def _cpu(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def format_table(rows: Sequence[Compared], base: str, head: str) -> str:
    """The comparison as a text table, one line per row of the runs."""
    lines = [f"base = {base}, head = {head}; ratios are head / base, one per pair",
             f"{'workload':<9} {'prod':>4} {'size':>5} {'system':<24} {'loop':<7} "
             f"{'base':>7} {'head':>7} {'ratio':>6} {'min-max':>11} {'ahead':>5} {'p':>5}  "
             f"{'cpu us/msg base':>15} {'head':>6} {'ratio':>6}"]
    for c in rows:
        w, prod, size, system, loop = c.key
        ahead, n = c.ahead
        rr = c.rate_ratios or [float("nan")]
        cr = f"{statistics.median(c.cpu_ratios):.2f}" if c.cpu_ratios else "-"
        lines.append(
            f"{w:<9} {prod:>4} {size:>5} {system[:24]:<24} {loop:<7} "
            f"{_rate(c.base_rate):>7} {_rate(c.head_rate):>7} {statistics.median(rr):>6.2f} "
            f"{min(rr):>5.2f}-{max(rr):<5.2f} {f'{ahead}/{n}':>5} {c.p:>5.2f}  "
            f"{_cpu(c.base_cpu):>15} {_cpu(c.head_cpu):>6} {cr:>6}")
    return "\n".join(lines)


def _git(*args: str) -> str:
    proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise ABError(f"git {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()


def native_module(src: Path) -> Path:
    """The compiled module that the native writer source ``src`` builds, beside it."""
    return src.with_name("_writer" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def build_native(src: Path) -> Path:
    """Compile the native writer ``src`` into the module beside it, as the package's build
    does (the interpreter's ``CFLAGS``, then ``-O2 -std=gnu11``), with this interpreter's
    compiler and headers: no build backend of the base's era needed."""
    var = sysconfig.get_config_var
    out = native_module(src)
    cmd = [*shlex.split(var("CC") or "cc"), *shlex.split(var("CFLAGS") or ""),
           *shlex.split(var("CCSHARED") or "-fPIC"), "-O2", "-std=gnu11", "-shared",
           f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(out)]
    build = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if build.returncode != 0:
        raise ABError(f"compiling {src} failed:\n{build.stderr[-2000:]}")
    return out


def checkout_base(rev: str, where: Path) -> Side:
    """``rev`` in a detached worktree at ``where``, its native writer built, this
    checkout's harness copied in."""
    commit = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    _git("worktree", "add", "--detach", "--force", str(where), commit)
    for src in sorted((where / "aiodiskqueue").rglob("_writer.c")):
        build_native(src)
    shutil.copytree(BENCH_DIR, where / HARNESS,
                    ignore=shutil.ignore_patterns("results", "__pycache__"))
    return Side(f"{rev} ({commit[:7]})", where, where / HARNESS / "run.py")


def run_once(side: Side, run_args: Sequence[str], out: Path) -> dict[str, Any]:
    """One run of the harness for ``side``; its JSON, checked to come from its tree."""
    proc = subprocess.run([sys.executable, str(side.script), *run_args, "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not out.exists():
        raise ABError(f"the {side.name} run failed (exit {proc.returncode}):\n"
                      f"{(proc.stdout + proc.stderr)[-3000:]}")
    doc: dict[str, Any] = json.loads(out.read_text())
    package = Path(doc["meta"].get("package", ""))
    if side.tree.resolve() not in package.resolve().parents:
        raise ABError(f"the {side.name} run imported the package from {package}, "
                      f"not from {side.tree}")
    return doc


def run_pairs(base: Side, head: Side, pairs: int, run_args: Sequence[str], workdir: Path,
              say: Any = print) -> None:
    """``pairs`` runs of each side, alternating which goes first."""
    for i in range(pairs):
        order = (base, head) if i % 2 == 0 else (head, base)
        for side in order:
            load = os.getloadavg()[0]
            tag = "base" if side is base else "head"
            doc = run_once(side, run_args, workdir / f"{tag}{i}.json")
            side.runs.append(doc)
            say(f"pair {i + 1}/{pairs}: {side.name} done in {doc['meta']['duration_s']} s "
                f"(load {load:.2f} before)")
        metas = [run["meta"] for run in base.runs + head.runs]
        if len({bool(m.get("native_writer")) for m in metas}) > 1:
            raise ABError("one side ran with the native writer and the other without: the "
                          "figures compare two write paths, not two revisions")
        if len({str(m.get("machine", {}).get("tmp_fs")) for m in metas}) > 1:
            raise ABError("the two sides put their queues on different filesystems")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the pairs, print the comparison; exit 2 if it could not be made."""
    argv = list(sys.argv[1:] if argv is None else argv)
    run_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, run_args = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="the git revision to compare this checkout with")
    ap.add_argument("--pairs", type=int, default=6, help="runs per side (default 6)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the comparison here")
    ap.add_argument("--keep", action="store_true", help="keep the worktree and the runs' JSON")
    args = ap.parse_args(argv)
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    if any(a == "--out" or a.startswith("--out=") for a in run_args):
        ap.error("--out is set by ab.py for each run")
    run_args = run_args or list(DEFAULT_RUN_ARGS)
    workdir = Path(tempfile.mkdtemp(prefix="aiodiskqueue-ab-"))
    if not any(a == "--tmpdir" or a.startswith("--tmpdir=") for a in run_args):
        # Both sides' queues on one filesystem, the repository's (not a tmpfs /tmp).
        queues = BENCH_DIR / "results" / "ab-queues"
        queues.mkdir(parents=True, exist_ok=True)
        run_args += ["--tmpdir", str(queues)]
    where = workdir / "base"
    started = time.strftime("%H:%M:%S")
    loads = [os.getloadavg()[0]]
    try:
        base = checkout_base(args.base, where)
        head = Side(f"this checkout ({_git('rev-parse', '--short', 'HEAD')}"
                    f"{', uncommitted changes' if _git('status', '--porcelain') else ''})",
                    REPO, BENCH_DIR / "run.py")
        for src in (REPO / "aiodiskqueue").rglob("_writer.c"):
            built = native_module(src)
            if built.exists() and built.stat().st_mtime < src.stat().st_mtime:
                print(f"ab: warning: {built.name} is older than {src.name} in this checkout; "
                      "the head runs the old build (pip install -e . rebuilds it)", flush=True)
        run_pairs(base, head, args.pairs, run_args, workdir, say=lambda m: print(m, flush=True))
        loads.append(os.getloadavg()[0])
        rows = compare(base.runs, head.runs)
    except (ABError, OSError, ValueError, KeyError) as exc:
        print(f"ab: {exc}", file=sys.stderr)
        if args.keep:
            print(f"kept: {workdir}", file=sys.stderr)
        return 2
    finally:
        if not args.keep:
            if where.exists():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                str(where)], capture_output=True, check=False)
            shutil.rmtree(workdir, ignore_errors=True)
            subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], capture_output=True,
                           check=False)
    print()
    print(format_table(rows, base.name, head.name))
    print(f"{args.pairs} pairs, {started}-{time.strftime('%H:%M:%S')}, load "
          f"{min(loads):.2f}-{max(loads):.2f}; run.py {' '.join(run_args)}")
    if args.keep:
        print(f"kept: {workdir}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "base": base.name, "head": head.name, "pairs": args.pairs, "run_args": run_args,
            "rows": [{"key": list(c.key), "base_rate": c.base_rate, "head_rate": c.head_rate,
                      "rate_ratios": c.rate_ratios, "ahead": list(c.ahead), "p": c.p,
                      "base_cpu": c.base_cpu, "head_cpu": c.head_cpu,
                      "cpu_ratios": c.cpu_ratios} for c in rows]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

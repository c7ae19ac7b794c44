"""Power cuts on the simulated disk of tests/powercut/, as many as asked.

    python bench/powercut.py --cuts 400 --seed 1 [--workload sync1 ...] [--images 2]

Each cut runs a workload on the FUSE filesystem that forgets what was not synced,
SIGKILLs it at a random moment and checks crash images of every kind (see
tests/powercut/images.py); prints a table of cuts, images, violations by kind, open
failures and hangs per workload and image kind, and the first findings with the seed
that reproduces each. Needs /dev/fuse, fusermount3 (Debian's fuse3) and mfusepy (the
dev extra). Exits 1 if anything was found.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "powercut"))

import harness

WORKLOADS = ("sync1", "default", "ack", "ackdefault", "purge", "repair", "empty", "roles",
             "procs", "spark", "broker", "brokerdefault")


def main(argv: list[str] | None = None) -> int:
    """Run the cuts and print the table; 0 if the contract held in every image."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuts", type=int, default=100, help="cuts per workload")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workload", action="append", choices=(*WORKLOADS, "liar", "produce"),
                    help="repeatable; default: " + " ".join(WORKLOADS))
    ap.add_argument("--images", type=int, default=1,
                    help="images of each random kind (prefix, pages) per cut")
    ap.add_argument("--max-run", type=float, default=0.6,
                    help="a cut comes up to this many seconds after the queue opened")
    ap.add_argument("--keep", help="directory for the work files (default: a temp dir)")
    args = ap.parse_args(argv)
    problem = harness.fuse_problem()
    if problem:
        print(f"cannot mount the simulated disk: {problem}", file=sys.stderr)
        return 2
    logging.getLogger("aiodiskqueue").setLevel(logging.ERROR)
    base = args.keep or tempfile.mkdtemp(prefix="powercut-")
    cuts: list[harness.Cut] = []
    start = time.monotonic()
    with harness.mounted(os.path.join(base, "mnt")) as m:
        for wl in args.workload or WORKLOADS:
            for i in range(args.cuts):
                seed = args.seed * 1_000_000 + i
                cuts.append(harness.run_cut(m, wl, seed, os.path.join(base, f"{wl}-{i}"),
                                            images_per_kind=args.images,
                                            max_run=args.max_run))
    print(f"{len(cuts)} cuts, {sum(len(c.outcomes) for c in cuts)} images in "
          f"{time.monotonic() - start:.0f} s (seed {args.seed}; work files in {base}, "
          "kept if anything was found)\n")
    print(harness.table(cuts))
    found = [(c, o) for c in cuts for o in c.outcomes if o.violations or o.hung]
    for c, o in found[:20]:
        what = "; ".join(f"{v}: {d}" for v, d in o.violations) or "hang"
        print(f"- {c.workload} seed {c.seed} image {o.kind}: {what}")
    if not found and not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

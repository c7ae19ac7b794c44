"""Memory: the resident set of a process holding one large unread queue.

Writes a queue of ``--messages`` records of ``--size`` bytes in go-diskqueue's format
(100 MiB segments, a consistent meta file; written with large writes, not with puts,
so the setup takes seconds), then, in a fresh child process, measures the resident set
(VmRSS from /proc) after importing the package, after opening the queue, after taking
``--take`` messages with ``get()``, and the peak (VmHWM). The figure that matters is
the growth over the interpreter's baseline: the queue keeps the backlog on disk and
only a bounded read-ahead (``read_buffer_bytes``) in memory.

Usage: ``python bench/bench_memory.py [--messages 10000000] [--size 1024] [--dir DIR]``
(10 M x 1 KiB needs ~10.3 GB of free disk; the files are deleted afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiodiskqueue._format.codec import HEADER_SIZE, frame
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.meta import Meta, store_meta

SEGMENT = 100 * 2**20

CHILD = r"""
import asyncio, json, sys
def rss():
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) * 1024
    return out
base = rss()
import aiodiskqueue
try:
    import uvloop
    run = uvloop.run
except ImportError:
    run = asyncio.run
imported = rss()
async def main():
    q = await aiodiskqueue.DiskQueue.open(sys.argv[1], "mem")
    opened = rss()
    depth = q.qsize()
    for _ in range(int(sys.argv[2])):
        await q.get()
    taken = rss()
    await q.aclose()
    return opened, taken, depth
opened, taken, depth = run(main())
print(json.dumps({"base": base, "imported": imported, "opened": opened, "taken": taken,
                  "depth": depth}))
"""


def write_queue(directory: str, messages: int, size: int) -> int:
    """Write ``messages`` records of ``size`` bytes as full segments; return bytes written."""
    lay = Layout(directory, "mem")
    per_file = SEGMENT // (HEADER_SIZE + size)
    chunk = frame([os.urandom(size) for _ in range(per_file)])
    left, num, total = messages, 0, 0
    while left > 0:
        k = min(per_file, left)
        data = chunk if k == per_file else chunk[: k * (HEADER_SIZE + size)]
        with open(lay.segment_path(num), "wb") as f:
            f.write(data)
        total += len(data)
        left -= k
        num += 1
    store_meta(lay.meta_path, Meta(messages, 0, 0, num - 1, len(data)))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--take", type=int, default=100_000)
    ap.add_argument("--dir", default=None,
                    help="where to write the queue (a temp dir in it; created if missing)")
    args = ap.parse_args()
    if args.dir is not None:
        os.makedirs(args.dir, exist_ok=True)
    d = tempfile.mkdtemp(prefix="aiodiskqueue-mem-", dir=args.dir)
    try:
        need = args.messages * (args.size + HEADER_SIZE)
        free = shutil.disk_usage(d).free
        if need > free * 0.9:
            sys.exit(f"needs {need / 1e9:.1f} GB of free disk in {d}, {free / 1e9:.1f} GB free")
        written = write_queue(d, args.messages, args.size)
        out = subprocess.run([sys.executable, "-c", CHILD, d, str(args.take)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    base = r["base"]["VmRSS"]  # the bare interpreter: the import counts against us too
    mib = 2**20
    print(f"one queue of {args.messages:,} unread {args.size}-byte messages "
          f"({written / 1e9:.1f} GB on disk), depth seen {r['depth']:,}")
    print(f"{'stage':<34} {'RSS MiB':>9} {'over baseline':>14}")
    print(f"{'interpreter (the baseline)':<34} {base / mib:>9.1f} {0.0:>14.1f}")
    for stage, key in (("after import", "imported"), ("queue open", "opened"),
                       (f"after {args.take:,} get()", "taken")):
        v = r[key]["VmRSS"]
        print(f"{stage:<34} {v / mib:>9.1f} {(v - base) / mib:>14.1f}")
    peak = r["taken"]["VmHWM"]
    print(f"{'peak (VmHWM)':<34} {peak / mib:>9.1f} {(peak - base) / mib:>14.1f}")


if __name__ == "__main__":
    main()

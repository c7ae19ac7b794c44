"""Web ingest benchmark: requests/s and latency of examples/web_ingest.py, vs an in-memory queue.

Starts the aiohttp ingest service as a child process four times (an
in-memory asyncio.Queue as the anchor, ``sync_every=2500``, ``sync_every=1``, and
``--workers`` service processes writing one queue group with a consumer process
of its own; ``--workers 0`` leaves that row out),
loads each with ``--requests`` POSTs of ``--size`` bytes
from ``--concurrency`` clients over loopback (after a short warm-up), waits
for the worker to drain, and prints requests/s, p50 and p99. A POST is
answered 202 only after ``await q.put(body)`` returned.

    python bench/bench_web_ingest.py --requests 20000 --concurrency 64 --workers 4
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "web_ingest.py"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table (or JSON with ``--json``)."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--requests", type=int, default=20_000)
    p.add_argument("-c", "--concurrency", type=int, default=64)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--workers", type=int, default=4,
                   help="service processes of the group row (0: leave the row out)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    spec = importlib.util.spec_from_file_location("web_ingest", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while defining
    spec.loader.exec_module(mod)
    results = asyncio.run(mod.bench(args.requests, args.concurrency, args.size, args.workers))
    if args.json:
        print(json.dumps({label: {"requests": r.requests, "errors": r.errors, "seconds": r.seconds,
                                  "rate": r.rate, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms}
                          for label, r in results}))
    else:
        print(f"{args.requests} POSTs of {args.size} B from {args.concurrency} concurrent clients")
        base = results[0][1].rate
        for label, r in results:
            print(f"{label:28} {r.rate:8.0f} req/s ({r.rate / base:4.2f}x)  "
                  f"p50 {r.p50_ms:6.2f} ms  p99 {r.p99_ms:6.2f} ms  errors {r.errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

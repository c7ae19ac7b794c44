"""``ls``, ``inspect``, ``verify`` and ``stats`` on one plain queue."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
import time
from typing import Any

from ..._format.layout import Layout
from ..._format.meta import load_meta
from ..follow import Watcher, quarantine_summary
from ..holders import holder, roles_state
from ..inspect import analyze, unindexed_tail
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    json_doc,
    json_line,
    out,
    pos,
    print_problems,
    rate,
    table,
)
from .target import scan


def ls_entry(lay: Layout) -> dict[str, Any]:
    """The ``ls`` facts of one queue: depth, positions, files, lock and roles."""
    segs = lay.segments()
    size = 0
    for path in segs.values():
        with contextlib.suppress(FileNotFoundError):
            size += os.stat(path).st_size
    try:
        meta = load_meta(lay.meta_path)
    except ValueError:
        meta = None
    roles = roles_state(lay)
    if meta is not None:
        # The meta as of the last sync, plus what a running writer added since (a live
        # producer: what it has published).
        tail, write = unindexed_tail(lay, meta, limit=roles.limit)
        depth, read, meta_state = meta.depth + tail, meta.read, "ok"
    else:
        # No usable meta: count what a reader would find (as the queue does on open).
        rep = analyze(lay, limit=roles.limit)
        depth, read, write, meta_state = rep.depth, rep.read, rep.write, rep.meta_state
    bad = lay.bad_files()
    return {
        "name": lay.name,
        "depth": depth,
        "segments": len(segs),
        "bytes": size,
        "read_file_num": read[0],
        "read_pos": read[1],
        "write_file_num": write[0],
        "write_pos": write[1],
        "bad_files": len(bad),
        "bad_file_names": [os.path.basename(b) for b in bad],
        "locked_by_pid": holder(lay),
        "meta": meta_state,
        "empty_messages": os.path.exists(lay.empty_marker_path),
        "roles": roles.to_dict(),
    }


def inspect_queue(args: argparse.Namespace, lay: Layout) -> int:
    """``inspect`` of one queue: the meta file, every segment, what is read and unread."""
    rep, roles = scan(args, lay)
    bad = [quarantine_summary(b, args.min_msg_size, args.max_msg_size) for b in rep.bad_files]
    if args.json:
        json_doc({**rep.to_dict(), "quarantined": bad, "roles": roles.to_dict()})
        return EXIT_OK
    out(f"queue     {rep.name} in {rep.directory}")
    m = rep.meta
    meta_file = os.path.basename(lay.meta_path)
    if m is None:
        out(f"meta      {meta_file}: {rep.meta_state}" +
            (f" ({rep.meta_error})" if rep.meta_error else ""))
    else:
        out(f"meta      {meta_file}: depth {m.depth}, read {pos(m.read)}, "
            f"write {pos(m.write)}")
    out("lock      " + ("not open" if rep.locked_by_pid is None
                        else f"open in process {rep.locked_by_pid}"))
    out(f"roles     {roles.describe()}")
    out(f"segments  {len(rep.segments)} file(s), {rep.bytes_on_disk} bytes")
    if rep.segments:
        rows = [["  FILE", "SIZE", "RECORDS", "RANGE", "CONSUMED", "UNREAD", "ROLE", "PROBLEM"]]
        for s in rep.segments:
            prob = "-" if s.problem is None else f"{s.problem} @ {s.problem_offset}"
            rows.append(["  " + s.file, str(s.size), str(s.consumed + s.unread),
                         f"0..{s.end}", str(s.consumed), str(s.unread), s.role, prob])
        table(rows, right=frozenset({1, 2, 4, 5}))
    unread = f"{rep.depth} message(s) unread, from {pos(rep.read)} to {pos(rep.write)}"
    out(f"unread    {unread}")
    if m is not None:
        state = "consistent" if m.depth == rep.indexed_depth else "MISMATCH"
        tail = rep.depth - (rep.indexed_depth or 0)
        extra = f"; {tail} more past the meta's write position" if tail else ""
        out(f"depth     meta {m.depth}, scan {rep.indexed_depth} ({state}){extra}")
    for q in bad:
        out(f"quarantined {q['file']}: {q['size']} bytes, {q['records']} readable record(s) "
            f"before offset {q['readable_bytes']} (dump --quarantined shows them)")
    for n in rep.notes:
        if not n.endswith(": quarantined"):
            out(f"note      {n}")
    if rep.problems:
        out(f"problems  {len(rep.problems)}")
        print_problems(rep.problems)
    else:
        out("problems  none")
    return EXIT_OK


def verify_queue(args: argparse.Namespace, lay: Layout) -> int:
    """``verify`` of one queue: exit 0 when sound, 1 listing each problem."""
    rep, roles = scan(args, lay)
    code = EXIT_OK if rep.sound else EXIT_PROBLEMS
    if args.json:
        json_doc({"name": rep.name, "directory": rep.directory, "sound": rep.sound,
                  "depth": rep.depth, "segments": len(rep.segments),
                  "problems": [p.to_dict() for p in rep.problems],
                  "quarantined": [os.path.basename(b) for b in rep.bad_files],
                  "locked_by_pid": rep.locked_by_pid, "notes": list(rep.notes),
                  "roles": roles.to_dict()})
        return code
    if rep.sound:
        out(f"{rep.name}: sound ({rep.depth} unread message(s) in "
            f"{len(rep.segments)} segment(s))")
    else:
        out(f"{rep.name}: {len(rep.problems)} problem(s)")
        print_problems(rep.problems)
    for b in rep.bad_files:
        out(f"  quarantined {os.path.basename(b)} (not a problem: set aside earlier)")
    if roles.live:
        limit = "" if roles.limit is None else f"; read up to {pos(roles.limit)}, published"
        out(f"  note: roles held: {roles.describe()}{limit}")
    elif rep.locked_by_pid is not None:
        out(f"  note: open in process {rep.locked_by_pid}; a stale meta is normal while "
            "it runs")
    return code


def stats_queue(args: argparse.Namespace, lay: Layout) -> int:
    """``stats`` of one queue: a line (or JSON object) per sample."""
    watcher = Watcher(lay, args.min_msg_size, args.max_msg_size)
    count = args.count if args.count is not None else (None if args.watch else 1)
    n = 0
    if not args.json:
        out(f"{'TIME':8}  {'DEPTH':>10}  {'PUT/S':>12}  {'GET/S':>12}  {'BYTES':>12}  "
            "READ / WRITE")
    while True:
        s = watcher.sample(time.monotonic())
        roles = roles_state(lay)
        wall = time.time()
        if args.json:
            json_line({"name": lay.name, "timestamp": wall, **s.to_dict(),
                       "roles": roles.to_dict()})
        else:
            clock = dt.datetime.fromtimestamp(wall).strftime("%H:%M:%S")
            out(f"{clock:8}  {s.depth:>10}  {rate(s.put_rate):>12}  {rate(s.get_rate):>12}  "
                f"{s.bytes_on_disk:>12}  {pos(s.read)} / {pos(s.write)}" +
                ("" if not roles.live else f"  ({roles.describe()})"))
        sys.stdout.flush()
        n += 1
        if count is not None and n >= count:
            return EXIT_OK
        time.sleep(args.interval)

"""``ls``, ``inspect``, ``verify`` and ``stats`` on a queue group: each shard and the total.

Each shard is a plain queue (:mod:`.queues` has what is shown of one); a damaged shard
(not a directory) and an unreadable group meta are problems of the group.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from typing import Any

from ...errors import QueueNotFound
from ..follow import Watcher
from ..group import GroupFiles, group_files
from ..holders import RolesState, roles_state
from ..inspect import ERROR, Problem, QueueReport
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    json_doc,
    json_line,
    out,
    pids,
    pos,
    print_problems,
    rate,
    table,
)
from .queues import ls_entry
from .target import scan


def group_entry(group: GroupFiles) -> dict[str, Any]:
    """The ``ls`` facts of a group: its totals and each shard's :func:`.queues.ls_entry`."""
    shards = [{**ls_entry(lay), "shard": num, "path": lay.directory}
              for num, lay in group.shards.items()]
    return {
        "name": group.name,
        "kind": "group",
        "path": group.path,
        "meta": "ok" if group.meta is not None else
                "missing" if group.meta_error is None else "unreadable",
        "depth": sum(s["depth"] for s in shards),
        "shards": shards,
        "segments": sum(s["segments"] for s in shards),
        "bytes": sum(s["bytes"] for s in shards),
        "bad_files": sum(s["bad_files"] for s in shards),
        "damaged_shards": list(group.damaged),
        "members": list(group.members),
        "producers": sorted({s["roles"]["producer"]["pid"] for s in shards
                             if s["roles"]["producer"] is not None}),
        "consumers": sorted({s["roles"]["consumer"]["pid"] for s in shards
                             if s["roles"]["consumer"] is not None}),
    }


def _analyze_group(args: argparse.Namespace, group: GroupFiles
                   ) -> list[tuple[str, QueueReport, RolesState]]:
    """Each shard's report and roles, labelled ``NAME/SHARD``."""
    reports = []
    for num, lay in group.shards.items():
        try:
            rep, roles = scan(args, lay)
        except QueueNotFound:
            continue  # an empty shard, or one removed (drained) since the listing
        reports.append((group.shard_label(num), rep, roles))
    return reports


def _group_meta_line(group: GroupFiles) -> str:
    m = group.meta
    if m is None:
        return "missing" if group.meta_error is None else f"unreadable ({group.meta_error})"
    return (f"version {m.version}, max_bytes_per_file {m.max_bytes_per_file}, "
            f"msg size {m.min_msg_size}..{m.max_msg_size}")


def _not_a_dir(group: GroupFiles, shard: str) -> Problem:
    return Problem("damaged shard", ERROR, shard, 0,
                   f"{os.path.join(group.path, shard)} is not a directory: a shard is one")


def inspect_group(args: argparse.Namespace, group: GroupFiles) -> int:
    """``inspect`` of a group: its meta, live consumers, each shard's summary, the total."""
    reports = _analyze_group(args, group)
    depth = sum(rep.depth for _, rep, _ in reports)
    if args.json:
        json_doc({"name": group.name, "kind": "group", "directory": group.directory,
                  "path": group.path, "meta": _group_meta_line(group), "depth": depth,
                  "members": list(group.members),
                  "shards": [{**rep.to_dict(), "shard": label, "roles": roles.to_dict()}
                             for label, rep, roles in reports]})
        return EXIT_OK
    out(f"group     {group.name} in {group.directory}")
    out(f"meta      {_group_meta_line(group)}")
    out("consumers " + (f"{len(group.members)} live: pids {pids(list(group.members))}"
                        if group.members else "none live"))
    out(f"shards    {len(reports)}, each a plain queue {group.name!r} in "
        f"{group.path}/SHARD ('inspect {group.path}/SHARD {group.name}' shows one in full)")
    if reports:
        rows = [["  SHARD", "DEPTH", "SEGMENTS", "BYTES", "READ", "WRITE", "PRODUCER",
                 "CONSUMER", "PROBLEMS"]]
        for label, rep, roles in reports:
            rows.append(["  " + label, str(rep.depth), str(len(rep.segments)),
                         str(rep.bytes_on_disk), pos(rep.read), pos(rep.write),
                         "-" if roles.producer is None else str(roles.producer.pid),
                         "-" if roles.consumer is None else str(roles.consumer.pid),
                         str(len(rep.problems))])
        table(rows, right=frozenset({1, 2, 3, 8}))
    out(f"unread    {depth} message(s) in the group")
    problems = [(label, p) for label, rep, _ in reports for p in rep.problems]
    problems += [(f"{group.name}/{d}", _not_a_dir(group, d)) for d in group.damaged]
    if problems:
        out(f"problems  {len(problems)}")
        for label, p in problems:
            out(f"  {label}: {p}")
    else:
        out("problems  none")
    return EXIT_OK


def verify_group(args: argparse.Namespace, group: GroupFiles) -> int:
    """``verify`` of a group: every shard; exit 0 when the group and each shard are sound."""
    reports = _analyze_group(args, group)
    sound = (group.meta_error is None and not group.damaged
             and all(rep.sound for _, rep, _ in reports))
    code = EXIT_OK if sound else EXIT_PROBLEMS
    if args.json:
        json_doc({"name": group.name, "kind": "group", "path": group.path, "sound": sound,
                  "meta": _group_meta_line(group), "damaged_shards": list(group.damaged),
                  "depth": sum(rep.depth for _, rep, _ in reports),
                  "shards": [{"shard": label, "sound": rep.sound, "depth": rep.depth,
                              "problems": [p.to_dict() for p in rep.problems],
                              "roles": roles.to_dict()} for label, rep, roles in reports]})
        return code
    if group.meta_error is not None:
        out(f"{group.name}: group meta unreadable ({group.meta_error})")
    for d in group.damaged:
        out(f"{group.name}/{d}: 1 problem(s)")
        print_problems([_not_a_dir(group, d)])
    for label, rep, _ in reports:
        if rep.sound:
            out(f"{label}: sound ({rep.depth} unread message(s) in "
                f"{len(rep.segments)} segment(s))")
        else:
            out(f"{label}: {len(rep.problems)} problem(s)")
            print_problems(rep.problems)
    out(f"{group.name}: " + ("sound" if sound else "problems found") +
        f" ({len(reports)} shard(s))")
    return code


def _sum_rate(rates: list[float | None]) -> float | None:
    known = [r for r in rates if r is not None]
    return sum(known) if known else None


def stats_group(args: argparse.Namespace, group: GroupFiles) -> int:
    """``stats`` of a group: a line per shard and the group's total, each sample.

    Shards that appear while it watches are added (their first sample has no rate);
    shards removed are dropped.
    """
    watchers: dict[int, Watcher] = {}
    count = args.count if args.count is not None else (None if args.watch else 1)
    n = 0
    if not args.json:
        out(f"{'TIME':8}  {'SHARD':20}  {'DEPTH':>10}  {'PUT/S':>12}  {'GET/S':>12}  "
            f"{'BYTES':>12}  READ / WRITE")
    while True:
        now = group_files(group.directory, group.name)
        shards = {} if now is None else now.shards
        watchers = {num: watchers.get(num) or Watcher(lay, args.min_msg_size,
                                                      args.max_msg_size)
                    for num, lay in shards.items()}
        mono, wall = time.monotonic(), time.time()
        samples = [(group.shard_label(num), w.sample(mono), roles_state(w.layout))
                   for num, w in watchers.items()]
        depth = sum(s.depth for _, s, _ in samples)
        put = _sum_rate([s.put_rate for _, s, _ in samples])
        get = _sum_rate([s.get_rate for _, s, _ in samples])
        size = sum(s.bytes_on_disk for _, s, _ in samples)
        if args.json:
            json_line({"name": group.name, "kind": "group", "timestamp": wall,
                       "depth": depth, "put_rate": put, "get_rate": get, "bytes": size,
                       "shards": [{"shard": label, **s.to_dict(), "roles": r.to_dict()}
                                  for label, s, r in samples]})
        else:
            clock = dt.datetime.fromtimestamp(wall).strftime("%H:%M:%S")
            for label, s, r in samples:
                out(f"{clock:8}  {label:20}  {s.depth:>10}  {rate(s.put_rate):>12}  "
                    f"{rate(s.get_rate):>12}  {s.bytes_on_disk:>12}  "
                    f"{pos(s.read)} / {pos(s.write)}" +
                    ("" if not r.live else f"  ({r.describe()})"))
            out(f"{clock:8}  {'TOTAL':20}  {depth:>10}  {rate(put):>12}  {rate(get):>12}  "
                f"{size:>12}  {len(samples)} shard(s)")
        sys.stdout.flush()
        n += 1
        if count is not None and n >= count:
            return EXIT_OK
        time.sleep(args.interval)

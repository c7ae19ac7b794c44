"""The ``aiodiskqueue`` command: look at, check and repair queues on disk.

Every command works on the files alone, so it also works on queues written by
go-diskqueue / nsqd. Read-only commands (``ls``, ``inspect``, ``dump``,
``verify``, ``stats``) never change a file and take ``--json``. ``repair``
refuses to run while a live process has the queue open.

Exit codes: 0 success (``verify``: sound; ``repair --dry-run``: nothing to do),
1 problems found or repairs needed, 2 usage or operational error (no such queue,
queue locked, unreadable directory), 130 interrupted.

Modules: :mod:`.parser` (the commands and their options), :mod:`.commands` (``ls``,
``inspect``, ``verify``, ``stats``, ``repair``), :mod:`.queues` and :mod:`.groups` (what
those show of one queue and of a queue group), :mod:`.dump`, :mod:`.target` (the queue or
group the arguments name), :mod:`.output` (exit codes, errors, printing, progress).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from ..._format.access import as_queue_error
from ...errors import QueueNotFound
from .output import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, CliError
from .parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CliError as exc:
        sys.stderr.write(f"aiodiskqueue: {exc}\n")
        return EXIT_ERROR
    except QueueNotFound as exc:
        sys.stderr.write(f"aiodiskqueue: {exc}\n")
        return EXIT_ERROR
    except PermissionError as exc:
        sys.stderr.write(f"aiodiskqueue: {as_queue_error(exc, args.directory)}\n")
        return EXIT_ERROR
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            # The reader went away (``| head``): stop quietly, and keep Python from
            # complaining again when it flushes stdout at exit.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK
        sys.stderr.write(f"aiodiskqueue: {exc}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED

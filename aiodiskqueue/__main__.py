"""``python -m aiodiskqueue``: the same command line as the ``aiodiskqueue`` script."""

from .tools.cli import main

raise SystemExit(main())

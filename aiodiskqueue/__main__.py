"""``python -m aiodiskqueue``: the same command line as the ``aiodiskqueue`` script."""

from .cli import main

raise SystemExit(main())

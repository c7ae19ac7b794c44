"""How many random examples the property tests draw.

Each property test names its default count through :func:`examples`. A deeper search
multiplies every count: ``AIODISKQUEUE_EXAMPLES=20 bash dev.sh test -m property``
draws twenty times as many (see README, Development). CI runs the defaults.
"""

from __future__ import annotations

import os

ENV = "AIODISKQUEUE_EXAMPLES"


def examples(default: int) -> int:
    """``default`` times the factor in ``$AIODISKQUEUE_EXAMPLES`` (1 when unset).

    Raises ValueError for a factor that is not a positive integer, so a typo does not
    quietly run the default search.
    """
    raw = os.environ.get(ENV, "1")
    try:
        factor = int(raw)
    except ValueError:
        raise ValueError(f"{ENV} must be a positive integer, not {raw!r}") from None
    if factor < 1:
        raise ValueError(f"{ENV} must be a positive integer, not {raw!r}")
    return default * factor

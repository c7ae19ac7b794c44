"""mkdocs hook: Sphinx roles in docstrings (``:meth:`put```) shown as plain inline code.

The docstrings use reStructuredText roles for cross-references; mkdocstrings renders
the role name as text before the code span. This drops the role and a leading ``~``.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj|const):(<code>)~?")


def on_page_content(html: str, **kwargs: Any) -> str:
    """Remove the role prefix from every rendered cross-reference."""
    return _ROLE.sub(r"\1", html)

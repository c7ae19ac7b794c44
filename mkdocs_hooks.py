"""mkdocs hooks: the README as the site's home page, and Sphinx roles shown as code.

The home page (``docs/index.md``) is the project's ``README.md`` followed by the contents
list that ``docs/index.md`` holds, so the front page is written once. The README links
into ``docs/`` as GitHub shows it; on the site those links lose the ``docs/`` prefix, and
links to files outside ``docs/`` (``CHANGELOG.md``, ``bench/README.md``) keep their text
only, as the site does not carry those files.

The docstrings use reStructuredText roles for cross-references (``:meth:`put```);
mkdocstrings renders the role name as text before the code span. The second hook drops
the role and a leading ``~``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj|const):(<code>)~?")
# A markdown link or image target: [text](target), the target without spaces.
_LINK = re.compile(r"(!?)\[([^\]]+)\]\(([^)\s]+)\)")
_HOME = "index.md"


def readme_for_site(text: str) -> str:
    """The README's markdown with its links made to work from the site's home page."""

    def fix(m: re.Match[str]) -> str:
        bang, label, target = m.groups()
        if re.match(r"[a-z][a-z0-9+.-]*:|#", target):
            return m.group(0)  # absolute (https:, mailto:) or an anchor on the page
        if target.startswith("docs/"):
            return f"{bang}[{label}]({target.removeprefix('docs/')})"
        return label  # a file of the repository that the site does not carry

    return _LINK.sub(fix, text)


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    """Put the README above the contents list of the home page."""
    if page.file.src_uri != _HOME:
        return markdown
    readme = Path(config["config_file_path"]).parent / "README.md"
    return readme_for_site(readme.read_text(encoding="utf-8")) + "\n\n" + markdown


def on_page_content(html: str, **kwargs: Any) -> str:
    """Remove the role prefix from every rendered cross-reference."""
    return _ROLE.sub(r"\1", html)

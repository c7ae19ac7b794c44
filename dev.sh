#!/usr/bin/env bash
# Sets up the project's virtual environment (.venv) and runs the demo or the tests.
#   bash dev.sh demo [args]   - the main job: crash/restart demo, a producer and a consumer
#                               process each killed once, then the Spark pipeline
#   bash dev.sh test [args]   - the whole test suite (args go to pytest; without args
#                               the core tests run first on the pure-Python write path)
#   bash dev.sh docs          - the documentation into site/ (mkdocs, warnings are errors)
#   bash dev.sh nox [args]    - the CI matrix and checks (noxfile.py), e.g. -s tests-3.12
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

setup() {
  if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
  fi
  # --no-compile: pip would byte-compile all of pyspark (half a minute); Python
  # compiles what is imported anyway.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile -e ".[$1]"
}

# The power-cut tests (tests/test_powercut.py) mount a FUSE filesystem: libfuse3 and
# fusermount3 come from Debian's fuse3. Installed quietly where missing and apt-get can;
# never fatal here: without FUSE those tests fail under CI=true and are skipped, with
# the reason, elsewhere.
ensure_fuse() {
  if command -v fusermount3 >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 \
      || [ "$(id -u)" -ne 0 ]; then
    return 0
  fi
  echo "== installing fuse3 (for the power-cut tests)"
  { apt-get install -y -qq fuse3 || { apt-get update -qq && apt-get install -y -qq fuse3; }; } \
    >/dev/null 2>&1 || echo "note: could not install fuse3; the power-cut tests need it" >&2
}

case "${1:-}" in
  demo)
    shift
    setup "spark,uvloop"
    exec .venv/bin/python examples/demo.py "$@"
    ;;
  test)
    shift
    setup "dev,spark,uvloop,metrics,cli,bench,broker"
    ensure_fuse
    if [ $# -eq 0 ]; then
      # The core once more without the native write lane: the Python I/O thread path
      # is what runs where no C compiler was available at install time.
      echo "== core tests, pure-Python write path (AIODISKQUEUE_PURE_PYTHON=1)"
      AIODISKQUEUE_PURE_PYTHON=1 .venv/bin/python -m pytest -q tests/test_core_*.py tests/test_engine_*.py \
        tests/test_roles.py
      echo "== the whole suite"
      # The slowest tests are listed at the end, so a CI log shows where its time went.
      set -- --durations=20
    fi
    exec .venv/bin/python -m pytest "$@"
    ;;
  docs)
    shift
    setup "docs"
    NO_MKDOCS_2_WARNING=1 exec .venv/bin/mkdocs build --strict --site-dir site "$@"
    ;;
  nox)
    shift
    setup "dev,spark,uvloop,metrics,cli,bench,broker,docs"
    exec .venv/bin/nox "$@"
    ;;
  *)
    echo "usage: bash dev.sh demo|test|docs|nox [args]" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Sets up the project's virtual environment (.venv) and runs the demo or the tests.
#   bash dev.sh demo [args]   - the main job: crash/restart demo, then the Spark pipeline
#   bash dev.sh test [args]   - the whole test suite (args go to pytest)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

setup() {
  if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
  fi
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$1]"
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
    exec .venv/bin/python -m pytest "$@"
    ;;
  *)
    echo "usage: bash dev.sh demo|test [args]" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: makes a virtualenv, installs the project
# with its dev tools, starts PostgreSQL if it is down, then ruff, mypy and pytest.
# Extra arguments go to pytest (e.g. `-m unit`, `-m "not slow"` or `-k fetch`).
#
# The tests mostly wait on processes (services starting, crash tests, paced workloads),
# so they run in EOS_TEST_WORKERS pytest-xdist workers (default 4, measured on two cores),
# the tests of one module-scoped fixture or lane on one worker (`--dist loadgroup` in
# pyproject.toml; docs/testing.md). `-m unit` runs in this process: it takes seconds, less
# than starting the workers would. An explicit `-n` is left to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev,server,spark]'

# PostgreSQL: the coordinator tests need it on 127.0.0.1:5432.
if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
  fi
fi

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy sdk eos_protocol eos_server partition_service coordinator_service eos_cli spark_jobs eos_security
echo "== pytest"
parallel=(-n "${EOS_TEST_WORKERS:-4}")
previous=""
for arg in "$@"; do
  if [[ "$previous $arg" == "-m unit" || "$arg" == -n* || "$arg" == --numprocesses* ]]; then
    parallel=()
  fi
  previous=$arg
done
set +e
.venv/bin/python -m pytest "${parallel[@]}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest selected no test (exit 5): not a failure"
  exit 0
fi
exit "$rc"

#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: makes a virtualenv, installs the project
# with its dev tools, starts PostgreSQL if it is down, then ruff, mypy and pytest.
# Extra arguments go to pytest (e.g. `-m unit`, `-m "not slow"` or `-k fetch`).
#
# The tests mostly wait on processes (services starting, crash tests, paced workloads),
# so they run in EOS_TEST_WORKERS pytest-xdist workers (default 4, measured on two cores),
# the tests of one module-scoped fixture or lane on one worker (`--dist loadgroup` in
# pyproject.toml; docs/testing.md). `-m unit` runs in this process: it takes seconds, less
# than starting the workers would. An explicit `-n` is left to pytest. The heavy tests
# (marker `heavy`, one lane of the parallel run) install what they need themselves: the
# compose run prepares podman from Debian's packages (scripts/podman-setup.sh, root) and
# fails if it cannot.
set -euo pipefail
cd "$(dirname "$0")/.."

# Phase times, printed at the end (and on the way out of a failed run).
phases=()
phase_start=$SECONDS
phase() {  # phase NAME: the previous phase ends here
  phases+=("$(printf '%-28s %4ds' "$current_phase" $((SECONDS - phase_start)))")
  current_phase=$1
  phase_start=$SECONDS
}
current_phase="install"
# Failed tests and their service logs (tests/support/failure_report.py)
export EOS_TEST_FAILURES
EOS_TEST_FAILURES=$(mktemp -t eos-test-failures.XXXXXX)
summary() {
  local rc=$?
  if [ -n "${archive_pid:-}" ]; then  # never left running behind the suite
    kill "$archive_pid" 2>/dev/null || true
    wait "$archive_pid" 2>/dev/null || true
  fi
  phases+=("$(printf '%-28s %4ds' "$current_phase" $((SECONDS - phase_start)))")
  echo
  echo "== phase times"
  printf '%s\n' "${phases[@]}"
  printf '%-28s %4ds\n' "total" "$SECONDS"
  if [ -s "$EOS_TEST_FAILURES" ]; then
    echo
    echo "== failed tests and their service logs"
    cat "$EOS_TEST_FAILURES"
  fi
  rm -f "$EOS_TEST_FAILURES"
  return "$rc"
}
trap summary EXIT

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev,server,spark]'

# The console's browser tests (tests/console) drive Debian's chromium through Playwright's
# driver (no browser is ever downloaded). Installed here when missing (CI runs this as
# root); a failed install stops the run at once, with the reason, instead of leaving those
# tests to fail later.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: /usr/bin/chromium is missing; as root: apt-get install -y chromium" >&2
    exit 1
  fi
  echo "== apt-get install chromium (the console's browser tests)"
  if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }; then
    echo "scripts/test.sh: installing chromium failed; the console's browser tests need it" >&2
    exit 1
  fi
fi

# The Jepsen-style run (tests/jepsen) skews a coordinator's clock with Debian's libfaketime.
if ! compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null && [ "$(id -u)" -eq 0 ]; then
  echo "== apt-get install faketime (tests/jepsen: skewed coordinator clocks)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q faketime >/dev/null; then
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q faketime >/dev/null
  fi
fi

# Process ids: Spark's Python daemon SIGKILLs whatever pid its JVM names for a worker it
# gives up on, reaped or not, and the suite's JVMs and services use pids (threads too) by
# the dozen a second; with the kernel's counter at 32,768 it wraps within minutes, so such
# a kill can land on another test's process (two runs lost a coordinator without a word in
# its log while it was so). 4,194,304 (the 64-bit maximum, systemd's default) makes a wrap
# take hours. Raised here when we may (root).
pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 0)
if [ "$pid_max" -lt 4194304 ] && [ "$(id -u)" -eq 0 ]; then
  if echo 4194304 > /proc/sys/kernel/pid_max 2>/dev/null; then
    echo "== kernel.pid_max $pid_max -> 4194304 (pids are not handed out again for hours)"
  else
    echo "== kernel.pid_max stays $pid_max (read-only here): a pid may be reused within minutes"
  fi
fi

# PostgreSQL: the coordinator tests need it on 127.0.0.1:5432.
if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
  fi
fi

# The Spark drivers' class archive (tests/support/jvm_archive.py): one JVM makes it beside
# ruff, mypy and the first tests; the drivers started after it is there map it.
archive_pid=""
if [ ! -f .venv/spark-classes.jsa ] && command -v java >/dev/null 2>&1; then
  .venv/bin/python -m tests.support.jvm_archive .venv/spark-classes.jsa \
    > .venv/spark-classes.log 2>&1 &
  archive_pid=$!
  export EOS_TEST_JVM_ARCHIVE=pending
fi

phase "ruff"
echo "== ruff"
.venv/bin/ruff check .
phase "mypy"
echo "== mypy"
.venv/bin/mypy sdk eos_protocol eos_server partition_service coordinator_service eos_cli spark_jobs eos_security
echo "== pytest"
# One parallel run: the `heavy` tests (an image build and a compose project, a Spark
# standalone cluster) are one lane of it, handed out first (tests/support/xdist_groups.py),
# so their waits on image layers, health checks and JVMs overlap the rest. A `-m EXPR` of
# the caller applies as given.
parallel=(-n "${EOS_TEST_WORKERS:-4}")
marker=""
rest=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -m) marker=$2; shift 2 ;;
    -m*) marker=${1#-m}; shift ;;
    -n*|--numprocesses*) parallel=(); rest+=("$1"); shift ;;
    *) rest+=("$1"); shift ;;
  esac
done
if [ "$marker" = unit ]; then
  parallel=()  # seconds in this process, less than starting the workers would take
fi
# The soak runs (marker `soak`, scripts/soak.sh) are left out unless the caller's -m names them.
if [[ "$marker" == *soak* ]]; then
  selection=${marker}
else
  selection="not soak${marker:+ and ($marker)}"
fi
phase "pytest${marker:+ -m $marker}"
rc=0
.venv/bin/python -m pytest --durations=40 "${parallel[@]}" -m "$selection" ${rest[@]+"${rest[@]}"} || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest selected no test (exit 5): not a failure"
  exit 0
fi
exit "$rc"

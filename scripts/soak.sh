#!/usr/bin/env bash
# The long runs the test command leaves out: the ten-minute retention soak (marker `soak`,
# EOS_SOAK_SECONDS sets its length) and the chaos suite's long mode (EOS_CHAOS_LONG=1:
# 100,000 records and eight injections per fault; EOS_CHAOS_RECORDS sets the count).
#
#   bash scripts/soak.sh              # both
#   bash scripts/soak.sh retention    # the retention soak alone
#   bash scripts/soak.sh chaos        # the chaos long mode alone
#
# Extra arguments after the first go to pytest. Needs what scripts/test.sh installs (run
# it once first) and PostgreSQL on 127.0.0.1:5432.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
[ "$#" -gt 0 ] && shift
if [ ! -x .venv/bin/python ]; then
  echo "scripts/soak.sh: no .venv; run bash scripts/test.sh once first" >&2
  exit 1
fi
case "$what" in
  all|retention|chaos) ;;
  *) echo "scripts/soak.sh: expected all, retention or chaos, not '$what'" >&2; exit 2 ;;
esac
rc=0
if [ "$what" != chaos ]; then
  echo "== retention soak (${EOS_SOAK_SECONDS:-600} s)"
  .venv/bin/python -m pytest -m soak -p no:cacheprovider "$@" tests/integration/test_retention_soak.py || rc=$?
fi
if [ "$what" != retention ]; then
  echo "== chaos, long mode"
  EOS_CHAOS_LONG=1 .venv/bin/python -m pytest -p no:cacheprovider "$@" tests/chaos/test_faults.py || rc=$?
fi
exit "$rc"

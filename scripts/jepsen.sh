#!/usr/bin/env bash
# A long Jepsen-style run on hosts in network namespaces (tests/jepsen/): PostgreSQL, three
# coordinators, three storage nodes and the clients each on a host of its own, a nemesis
# injecting the seeded faults one after the other (partitions of every shape, SIGKILL,
# SIGSTOP, skewed clocks), and a checker of every exactly-once guarantee.
#
#   bash scripts/jepsen.sh --minutes 10 --seed 7
#   bash scripts/jepsen.sh --minutes 30 --seed 8 --out /tmp/jepsen
#
# The report lands in one folder (jepsen-runs/seed-S-<time>/ by default): the histories
# (history/*.jsonl), the services' logs (cluster/logs/), summary.md (per fault kind: the
# faults, the anomalies, the longest window without a successful commit),
# anomalies.json (each anomaly with its transactions) and timeline.svg (latency and
# commits per second over time, the fault windows shaded). Exit status 1 when the checker
# found an anomaly. Needs root (namespaces), libfaketime (installed here when missing),
# and what scripts/test.sh installs (run it once first).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "scripts/jepsen.sh: no .venv; run bash scripts/test.sh once first" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/jepsen.sh: network namespaces need root" >&2
  exit 1
fi
if ! compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null; then
  echo "== apt-get install faketime (the skewed coordinator clocks)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q faketime >/dev/null
fi
exec .venv/bin/python -m tests.jepsen.run "$@"

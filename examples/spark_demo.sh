#!/usr/bin/env bash
# The sample Spark pipeline end to end on this machine: a local EOS cluster (`eos up`),
# 2,000 JSON events (a few malformed), the exactly-once job in local[2] mode routing them
# to an "enriched" and a "dead-letter" topic, then the check (every event exactly once,
# committed offsets at the end of the input).
#
#   examples/spark_demo.sh            # record transform
#   examples/spark_demo.sh --dataframe  # the DataFrame form of the same transform
set -euo pipefail
cd "$(dirname "$0")/.."
PORT_BASE=${PORT_BASE:-18080}
URL="http://127.0.0.1:${PORT_BASE}"
DATA=$(mktemp -d /tmp/eos-spark-demo.XXXXXX)
EOS=${EOS:-.venv/bin/eos}

"$EOS" up --data-dir "$DATA" --port-base "$PORT_BASE" >"$DATA/up.log" 2>&1 &
UP=$!
trap 'kill "$UP" 2>/dev/null; wait "$UP" 2>/dev/null; rm -rf "$DATA"' EXIT
for _ in $(seq 1 100); do
  curl -fsS "$URL/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done

"$EOS" topics create events-enriched --partitions 2 --bootstrap "$URL" >/dev/null
"$EOS" topics create events-dead-letter --partitions 2 --bootstrap "$URL" >/dev/null
"$EOS" spark sample-events --bootstrap "$URL" --topic events --count 2000
"$EOS" spark run --bootstrap "$URL" --app demo --source events \
  --transform spark_jobs.examples.events:record_transform \
  --option enriched=events-enriched --option dead_letter=events-dead-letter \
  --max-batch-records 500 --conf spark.ui.enabled=false "$@" 2> >(grep -v WARN >&2)
"$EOS" spark check --bootstrap "$URL" --app demo --source events \
  --output events-enriched --output events-dead-letter
echo "first enriched events:"
"$EOS" consume events-enriched --bootstrap "$URL" --from-beginning --max-records 3 --idle-timeout 2 2>/dev/null || true

#!/usr/bin/env bash
# The main job on a fresh machine: makes a virtualenv, installs EOS and runs it in the
# foreground (Ctrl-C stops it). Arguments go to `eos node`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e .
exec .venv/bin/eos node --node-id 1 --port 9091 --data-dir ./data/node-1 \
  --internal-token "${EOS_INTERNAL_TOKEN:-local-internal-token}" \
  --txn-verification "${EOS_TXN_VERIFICATION:-off}" "$@"

#!/usr/bin/env bash
# The main job on a fresh machine: makes a virtualenv, installs EOS with its Spark extra,
# and runs `eos demo` — a local cluster, sample events, the Spark exactly-once pipeline with
# a task that fails and is retried, and the check. Arguments go to `eos demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[server,spark]'
exec .venv/bin/eos demo "$@"

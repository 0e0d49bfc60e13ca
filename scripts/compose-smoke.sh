#!/usr/bin/env bash
# A real run of docker-compose.yml (scripts/compose_smoke.py says what it does): builds
# the images, brings every service up and healthy, runs a transaction and the exactly-once
# Spark pipeline through the published ports, kills and restarts a node, downs and ups the
# project, and removes it with its volumes. Prints the figures (build time, time to
# healthy, the pipeline's records/s); exit 0 only if every check held.
#
# With a Docker engine it uses `docker compose`. Without one it prepares podman first
# (scripts/podman-setup.sh: Debian packages, containers.conf, a debootstrap base when no
# registry is reachable), which needs root.
#
#   bash scripts/compose-smoke.sh [--events N] [--report figures.json]
#
# Behind a TLS-inspecting proxy the image build needs its CA: EOS_BUILD_CA_FILE=path, or
# the certificates this host added to its own trust (/usr/local/share/ca-certificates)
# are handed to the build as a secret.
set -euo pipefail
cd "$(dirname "$0")/.."
# podman's network helpers (netavark) call iptables and nft, which live in the sbin
# directories: a non-login or CI shell may not have them on its PATH.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q -e '.[server,spark]' 'podman-compose>=1.2,<2'

if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  bash scripts/podman-setup.sh
fi

if [ -z "${EOS_BUILD_CA_FILE:-}" ] && compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  bundle=$(mktemp)
  trap 'rm -f "$bundle"' EXIT
  cat /usr/local/share/ca-certificates/*.crt > "$bundle"
  export EOS_BUILD_CA_FILE=$bundle
fi

.venv/bin/python scripts/compose_smoke.py "$@"

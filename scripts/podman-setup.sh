#!/usr/bin/env bash
# Makes a Debian machine without a Docker engine able to build and run the compose file
# with podman, and says why not if it cannot (exit 1, one line per problem).
#
#   * installs podman, runc and debootstrap from Debian's packages if they are missing;
#   * sets the two podman settings this kind of machine needs in the system
#     containers.conf (runc, since crun fails on a cgroup-v1 kernel; no default ulimits,
#     which an unprivileged sandbox may refuse), keeping the rest of the file;
#   * when the base image debian:bookworm-slim is missing and no registry can give it,
#     builds the same system with `debootstrap --variant=minbase bookworm` and imports it
#     under that name (what the Dockerfile starts from).
#
# Idempotent: a second run changes nothing. Used by scripts/test.sh (for the compose
# test) and scripts/compose-smoke.sh. Needs root for apt and /etc/containers.
set -euo pipefail
# podman's network helpers (netavark) call iptables and nft, which live in the sbin
# directories: a non-login or CI shell may not have them on its PATH.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

BASE_IMAGE=docker.io/library/debian:bookworm-slim
MIRROR=${EOS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CONF=/etc/containers/containers.conf

fail() { echo "podman-setup: $*" >&2; exit 1; }

missing=()
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || fail "needs root to install ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q podman runc debootstrap uidmap >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q podman runc debootstrap uidmap >/dev/null; } \
    || fail "apt-get could not install podman, runc and debootstrap"
fi

# One `key = value` under a [section] of containers.conf, added or replaced in place.
set_conf() {
  local section=$1 key=$2 value=$3
  python3 - "$CONF" "$section" "$key" "$value" <<'PY'
import re, sys
path, section, key, value = sys.argv[1:]
try:
    text = open(path).read()
except FileNotFoundError:
    text = ""
lines = text.splitlines()
header = f"[{section}]"
line = f"{key} = {value}"
if header not in [l.strip() for l in lines]:
    lines += ["", header, line]
else:
    start = [l.strip() for l in lines].index(header)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("[")), len(lines))
    for i in range(start + 1, end):
        if re.match(rf"\s*{re.escape(key)}\s*=", lines[i]):
            lines[i] = line
            break
    else:
        lines.insert(start + 1, line)
new = "\n".join(lines).lstrip("\n") + "\n"
if new != text:
    open(path, "w").write(new)
PY
}
mkdir -p "$(dirname "$CONF")"
set_conf containers default_ulimits '[]'
set_conf engine runtime '"runc"'

podman info >/dev/null 2>&1 || fail "podman does not start here: $(podman info 2>&1 | tail -1)"

if ! podman image exists "$BASE_IMAGE"; then
  if ! podman pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "podman-setup: no registry gives $BASE_IMAGE; building it with debootstrap" >&2
    root=$(mktemp -d /var/tmp/bookworm.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase bookworm "$root" "$MIRROR" >/dev/null \
      || fail "debootstrap bookworm from $MIRROR failed"
    # The same package sources as the published image, and no caches.
    rm -f "$root/etc/apt/sources.list"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
      "$root"/usr/share/man/*
    tar -C "$root" -c . | podman import -q - "$BASE_IMAGE" >/dev/null \
      || fail "podman import of the debootstrap tree failed"
  fi
fi
echo "podman-setup: podman $(podman version --format '{{.Client.Version}}'), base $BASE_IMAGE ready"

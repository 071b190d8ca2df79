#!/usr/bin/env bash
# Creates .venv and installs everything the project needs on a fresh Debian machine.
#   scripts/bootstrap.sh          runtime + test packages
#   scripts/bootstrap.sh browser  also Debian's chromium for the browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

apt_install() {  # apt_install PKG... : installs Debian packages when root, else explains what is missing.
  if [ "$(id -u)" = 0 ]; then
    if [ ! -f /var/lib/apt/.kvpool-updated ]; then apt-get update -qq && touch /var/lib/apt/.kvpool-updated; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "error: missing Debian packages: $* (run: sudo apt-get install $*)" >&2
    exit 1
  fi
}

# The Mooncake wheel links against libibverbs even for TCP transport.
if ! ldconfig -p | grep -q 'libibverbs.so.1'; then
  echo "installing libibverbs1 (needed by the Mooncake Store wheel)"
  apt_install libibverbs1
fi
# etcd: the HA masters' leader election in tests and in `python -m bench.faults --scenarios failover` (they start
# their own etcd on free ports; nothing runs as a service).
if ! command -v etcd >/dev/null; then
  echo "installing etcd-server (HA master tests and the failover bench)"
  apt_install etcd-server
fi
# tests/deploy checks the service units of deploy/systemd/ with systemd's own verifier (no running systemd needed).
if ! command -v systemd-analyze >/dev/null; then
  echo "installing systemd (systemd-analyze verifies deploy/systemd/)"
  apt_install systemd
fi
# Prometheus 2.42's promtool checks deploy/prometheus/ (config, rules, rule unit tests) and tests/integration runs
# its prometheus binary on a free port against a real dashboard. Installed without its recommended node exporter and
# with service starts refused (policy-rc.d), so no daemon is left holding port 9090 or 9100; nothing is enabled.
if ! command -v promtool >/dev/null; then
  echo "installing prometheus (promtool checks deploy/prometheus/; integration tests run the binary on free ports)"
  if [ "$(id -u)" = 0 ] && [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    apt_install --no-install-recommends prometheus
    rm -f /usr/sbin/policy-rc.d && trap - EXIT
  else
    apt_install --no-install-recommends prometheus
  fi
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then systemctl disable --now prometheus 2>/dev/null || true; fi
fi
if [ "${1:-}" = browser ] && [ ! -x /usr/bin/chromium ]; then
  echo "installing chromium (browser tests)"
  apt_install chromium
fi

pip_install() {  # pip install -q, without the warnings some machines' pip.conf gives for missing local indexes
  "$VENV/bin/pip" install -q "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.installed"
if [ ! -f "$stamp" ] || [ requirements.txt -nt "$stamp" ] || [ requirements-dev.txt -nt "$stamp" ]; then
  pip_install --upgrade pip
  pip_install -r requirements.txt -r requirements-dev.txt
  touch "$stamp"
fi

# The compiled block-hash chain (agent/datapath/_chainhash.c, optional: keys of a long prompt about 3x faster). It needs a C
# compiler and the OpenSSL and xxhash headers; without them agent/datapath/hashing.py uses its pure-Python path.
missing=()
command -v cc >/dev/null || missing+=(gcc)
[ -f /usr/include/openssl/evp.h ] || missing+=(libssl-dev)
[ -f /usr/include/xxhash.h ] || missing+=(libxxhash-dev)
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
  echo "installing ${missing[*]} (compiled block hashing)"
  apt_install "${missing[@]}" || echo "warning: could not install ${missing[*]}" >&2
fi
"$VENV/bin/python" scripts/build_native.py \
  || echo "warning: agent.datapath._chainhash not built; block hashing runs in pure Python (slower, same digests)" >&2

#!/usr/bin/env bash
# Installs Prometheus and promtool (Debian's `prometheus` package) when they are missing:
# the rules' unit tests and the live test (tests/ops/) need both. Run as root, or with sudo.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "ops/prometheus/setup.sh: no apt-get here: install Prometheus 2.42 or later" \
        "(the prometheus and promtool binaries) and put them on PATH" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# The package's service is not wanted: the tests start their own server.
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v promtool >/dev/null && command -v prometheus >/dev/null

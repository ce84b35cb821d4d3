#!/usr/bin/env bash
# Interop with gRPC C-core: builds the example binaries, makes a virtualenv with the pinned
# grpcio, and runs the four directions in interop.py (the fourth measures attempts per call).
# Loopback only; every wait is bounded.
#
#   bash tests/interop/run.sh
#
# `--venv-only` makes the virtualenv and stops.
# INTEROP_VENV chooses where the virtualenv lives (default: target/interop-venv).
set -euo pipefail
cd "$(dirname "$0")/../.."

GRPCIO_VERSION=1.85.3
venv="${INTEROP_VENV:-target/interop-venv}"

if ! "$venv/bin/python" -c "import grpc, sys; sys.exit(grpc.__version__ != '$GRPCIO_VERSION')" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "grpcio==$GRPCIO_VERSION"
fi
if [ "${1:-}" = "--venv-only" ]; then
    exit 0
fi

# Over the workspace, as `cargo test --workspace` built them: a no-op after it.
cargo build --locked --workspace --example server --example client --example relay

exec "$venv/bin/python" tests/interop/interop.py --bin target/debug/examples "$@"

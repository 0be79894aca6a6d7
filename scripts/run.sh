#!/usr/bin/env bash
# The main job: build tarn and run it. On first run it creates a pool and a
# volume "disk0" under ./tarn-data and serves it over NBD.
#   bash scripts/run.sh [--data-dir DIR] [--listen 127.0.0.1:10809]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/deps.sh --serve
cargo build --release -p tarn-cli >&2
# tarn run prints the NBD URIs and example client commands itself
echo "scripts/run.sh: starting tarn run $* (client tools such as nbdinfo, qemu-img, nbdfuse: bash scripts/deps.sh)" >&2
exec target/release/tarn run "$@"

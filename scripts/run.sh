#!/usr/bin/env bash
# The main job: build tarn and run it. On first run it creates a pool and a
# volume "disk0" under ./tarn-data and serves it over NBD.
#   bash scripts/run.sh [--data-dir DIR] [--listen 127.0.0.1:10809]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/deps.sh --serve
cargo build --release -p tarn-cli >&2
listen=127.0.0.1:10809
prev=
for a in "$@"; do
  case $a in --listen=*) listen=${a#--listen=};; esac
  [ "$prev" = --listen ] && listen=$a
  prev=$a
done
cat >&2 <<HINT
tarn: serving volume disk0 at nbd://$listen/disk0 (Ctrl-C / SIGTERM stops cleanly)
  inspect:  nbdinfo nbd://$listen/disk0
  copy in:  qemu-img convert -n -O raw disk.img nbd://$listen/disk0
  as file:  mkdir m && nbdfuse m/disk nbd://$listen/disk0 &
  kernel:   nbd-client ${listen%:*} ${listen##*:} -N disk0 /dev/nbd0   (needs the nbd module)
  (client tools: bash scripts/deps.sh)
HINT
exec target/release/tarn run "$@"

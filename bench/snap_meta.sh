#!/usr/bin/env bash
# Metadata per snapshot of a block volume (issue 15: "a version costs the
# blocks it changed plus < 200 bytes of metadata"; the engine's side of it).
# Two volumes of one pool, each 1 MiB written first, then ROUNDS rounds of
# one 4 KiB overwrite (block i mod 256, nbdsh through `tarn serve`):
#   a: no snapshot;  b: a `tarn snap create` after each overwrite.
# The server is stopped (a checkpoint) before each reading of `pool status
# --json` offline. Per snapshot beyond the plain overwrite: pool `used`
# (blocks the snapshots keep) and `metadata` (store nodes and catalog).
#   bash bench/snap_meta.sh            # ROUNDS=200
#   TARN=/path/to/other/tarn bash bench/snap_meta.sh   (an older build)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
ROUNDS=${ROUNDS:-200}
W=$(mktemp -d /var/tmp/tarn-bench-snapmeta.XXXXXX)
POOL=$W/pool.img
SOCK=$W/nbd.sock
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT

serve() {
  "$TARN" serve -p "$POOL" --socket "$SOCK" >>"$W/serve.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 100); do
    [ -S "$SOCK" ] && nbdinfo --list "nbd+unix://?socket=$SOCK" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "tarn serve did not come up: $(tail -3 "$W/serve.log")" >&2
  exit 1
}
stop() { kill -TERM "$PID"; wait "$PID"; PID=; rm -f "$SOCK"; }
status() { "$TARN" pool status --json -p "$POOL" | jq ".$1"; }
# write VOL OFFSET LEN: random bytes, flushed
write() {
  PATH=/usr/bin:$PATH nbdsh -u "nbd+unix:///$1?socket=$SOCK" \
    -c "import os; h.pwrite(os.urandom($3), $2); h.flush()"
}
run() { # VOL SNAPSHOTS(0/1)
  "$TARN" vol create "$1" --size 64M -p "$POOL" >/dev/null
  serve
  write "$1" 0 $((1 << 20))
  for i in $(seq 1 "$ROUNDS"); do
    write "$1" $(((i % 256) * 4096)) 4096
    [ "$2" = 1 ] && "$TARN" snap create "$1@s$i" -p "$POOL" >/dev/null
  done
  stop
}

"$TARN" pool create "$POOL" --size 4G >/dev/null
U0=$(status used) M0=$(status metadata)
run a 0
U1=$(status used) M1=$(status metadata)
run b 1
U2=$(status used) M2=$(status metadata)
INLINE=$(status inline_dead_lists)
echo "# bench/snap_meta.sh (ROUNDS=$ROUNDS, $TARN) $(date -u +%FT%TZ)"
echo "volume a (1 MiB, $ROUNDS overwrites of 4 KiB): used +$((U1 - U0)) B, metadata +$((M1 - M0)) B"
echo "volume b (the same, a snapshot after each overwrite): used +$((U2 - U1)) B, metadata +$((M2 - M1)) B"
echo "per snapshot beyond the plain overwrite: blocks $((((U2 - U1) - (U1 - U0)) / ROUNDS)) B (the old block it keeps: 4096, but none for the last snapshot), metadata $((((M2 - M1) - (M1 - M0)) / ROUNDS)) B; dead lists kept in the catalog: $INLINE"

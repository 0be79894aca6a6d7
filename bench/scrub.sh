#!/usr/bin/env bash
# Scrub speed against the device's own sequential read rate, in one run:
# fill a volume, stop the server, then (caches dropped before each) read the
# pool file's first bytes sequentially with dd, and `tarn pool scrub` it
# unthrottled and throttled. Not part of the tests.
#
#   bash bench/scrub.sh
# Env: BENCH_SIZE=2G (volume, filled sequentially), BENCH_DIR=/var/tmp/tarn-bench,
#      BENCH_ROUNDS=3, SCRUB_RATE=200M (the throttled run), TARN=target/release/tarn
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$BENCH/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
SIZE=${BENCH_SIZE:-2G}
ROUNDS=${BENCH_ROUNDS:-3}
RATE=${SCRUB_RATE:-200M}
DIR=${BENCH_DIR:-/var/tmp/tarn-bench}/scrub.$$
OUT=$BENCH/results/$(date +%Y-%m-%d-%H%M%S)-scrub.txt
export LC_ALL=C
mkdir -p "$DIR" "$BENCH/results"
SRV=
cleanup() { [ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
now() { date +%s.%N; }

pool=$DIR/pool.img
"$TARN" pool create "$pool" --size 4G >/dev/null
"$TARN" vol create bench --size "$SIZE" -p "$pool" >/dev/null
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
"$TARN" serve -p "$pool" --listen "127.0.0.1:$port" >"$DIR/serve.log" 2>&1 &
SRV=$!
for _ in $(seq 1 100); do nbdinfo --size "nbd://127.0.0.1:$port/bench" >/dev/null 2>&1 && break; sleep 0.1; done
fio --name=fill --ioengine=nbd --uri="nbd://127.0.0.1:$port/bench" --rw=write --bs=1M --iodepth=8 \
  --size="$SIZE" --output=/dev/null >/dev/null
kill -TERM "$SRV"; wait "$SRV" 2>/dev/null || true; SRV=
data_mib=$("$TARN" pool status -p "$pool" --json | python3 -c 'import json,sys;print(json.load(sys.stdin)["used"]>>20)')
# The data area starts after the labels and the journal: read that much more.
span_mib=$((data_mib + 128))

{
  echo "scrub benchmark $(date +%F\ %T), $(git -C "$REPO" rev-parse --short HEAD), fs $(df --output=fstype "$DIR" | tail -1), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "volume $SIZE filled sequentially: $data_mib MiB of data; device read = dd of the pool file's first $span_mib MiB, caches dropped before every run"
  for r in $(seq 1 "$ROUNDS"); do
    drop_caches; t0=$(now)
    dd if="$pool" of=/dev/null bs=1M count="$span_mib" status=none
    t1=$(now); dev=$(python3 -c "print(round($span_mib/($t1-$t0)))")
    drop_caches; t0=$(now)
    "$TARN" pool scrub -p "$pool" --json >"$DIR/scrub.json"
    t1=$(now); scrub=$(python3 -c "print(round($data_mib/($t1-$t0)))")
    echo "round $r: device $dev MiB/s, scrub $scrub MiB/s = $(python3 -c "print(f'{$scrub/$dev:.2f}')")x (wall time incl. pool open)"
  done
  drop_caches; t0=$(now)
  "$TARN" pool scrub -p "$pool" --rate "$RATE" --json >"$DIR/scrub.json"
  t1=$(now)
  echo "throttled --rate $RATE: $(python3 -c "print(round($data_mib/($t1-$t0)))") MiB/s"
  python3 -c 'import json,sys;j=json.load(open(sys.argv[1]));print("last scrub:",{k:j[k] for k in ("blocks","bad_copies","repaired","lost_blocks")})' "$DIR/scrub.json"
} | tee "$OUT"

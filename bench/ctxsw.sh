#!/usr/bin/env bash
# Context switches and CPU per request of tarn binaries serving warm 1 MiB
# sequential reads (fio nbd engine, QD8, TCP loopback, 2 GiB prefilled,
# page cache warm), measured with `perf stat -e context-switches,task-clock`
# attached to each server for the length of a fio run. Servers stay up;
# the order rotates per round. Software events only (no PMU needed). Not
# part of the tests.
#
#   bash bench/ctxsw.sh [ROUNDS] TARN_BINARY...
# Env: CTXSW_SECS=5  CTXSW_DIR=/var/tmp/tarn-ctxsw
# Prints per round and binary: MiB/s, context switches per request, server
# CPU microseconds per request (task-clock over requests in the window).
set -euo pipefail
R=${1:?rounds}; shift
[ $# -gt 0 ] || { echo "ctxsw: give one or more tarn binaries" >&2; exit 2; }
SECS=${CTXSW_SECS:-5}
for c in fio perf nbdinfo python3; do
  command -v "$c" >/dev/null || { echo "ctxsw: $c is missing" >&2; exit 1; }
done
mkdir -p "${CTXSW_DIR:-/var/tmp/tarn-ctxsw}"
D=$(mktemp -d "${CTXSW_DIR:-/var/tmp/tarn-ctxsw}/c.XXXX")
declare -a PID URI BIN
cleanup() {
  set +e
  for p in "${PID[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$D"
}
trap cleanup EXIT
i=0
for b in "$@"; do
  w=$D/t$i; mkdir -p "$w"
  p=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  "$b" pool create "$w/pool.img" --size 4G >/dev/null
  "$b" vol create bench --size 2G -p "$w/pool.img" >/dev/null
  "$b" serve -p "$w/pool.img" --listen "127.0.0.1:$p" >"$w/log" 2>&1 &
  PID[i]=$!; URI[i]=nbd://127.0.0.1:$p/bench; BIN[i]=$b
  for k in $(seq 150); do
    nbdinfo --size "${URI[i]}" >/dev/null 2>&1 && break
    [ "$k" = 150 ] && { echo "ctxsw: $b did not start" >&2; cat "$w/log" >&2; exit 1; }
    sleep 0.2
  done
  fio --name=prefill --ioengine=nbd --uri="${URI[i]}" --rw=write --bs=1M --iodepth=8 --size=2G \
    --output=/dev/null >/dev/null 2>&1
  i=$((i + 1))
done
n=$i
echo "# ctxsw: $R rounds x ${SECS}s, load at start $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$R"); do
  for j in $(seq 0 $((n - 1))); do
    k=$(((j + r) % n))
    perf stat -e context-switches,task-clock -x, -o "$D/ps" -p "${PID[k]}" -- sleep "$SECS" >/dev/null 2>&1 &
    sp=$!
    fio --name=sr1m --ioengine=nbd --uri="${URI[k]}" --rw=read --bs=1M --iodepth=8 --size=2G --time_based \
      --runtime="$SECS" --output-format=json --output="$D/fio.json" >/dev/null 2>&1
    wait "$sp"
    python3 - "$D/fio.json" "$D/ps" "$r" "${BIN[k]}" "$SECS" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["read"]
ev = {}
for line in open(sys.argv[2]):
    f = line.split(",")
    if len(f) > 3 and f[0].replace(".", "").isdigit():
        ev[f[2]] = float(f[0])
req = max(j["iops"] * float(sys.argv[5]), 1)
print(f"round {sys.argv[3]} {sys.argv[4]}: {j['bw'] / 1024:.0f} MiB/s, "
      f"context switches/request {ev.get('context-switches', 0) / req:.2f}, "
      f"CPU us/request {ev.get('task-clock', 0) * 1000 / req:.0f}")
PY
  done
done
echo "# load at end $(cut -d' ' -f1-3 /proc/loadavg)"

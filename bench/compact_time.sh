#!/usr/bin/env bash
# How long `tarn pool compact` takes to put a randomly written volume back
# in order, against the time to read that volume once over NBD (nbdcopy to
# /dev/null): a volume of SIZE_MIB written once in random 4 KiB order by fio
# (every block once, append placement: each block lands after the one
# written before it, so the head is SIZE/4 KiB scattered extents), a
# snapshot (the compaction then moves shared blocks by Relocate), then the
# compaction through the running server. Rounds alternate the binaries
# (TARN_BASE, when set, against TARN), each on a fresh pool of its own.
#
#   bash bench/compact_time.sh   env: TARN=<binary> TARN_BASE=<binary> SIZE_MIB=128 ROUNDS=2 LIMIT=900
# Output: bench/results/<date>-compact-time.txt
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BENCH=$REPO/bench
source "$BENCH/common.sh"
TARN=${TARN:-$REPO/target/release/tarn}
SIZE=$((${SIZE_MIB:-128} << 20))
ROUNDS=${ROUNDS:-2}
LIMIT=${LIMIT:-900}
need_tools compact_time fio nbdinfo nbdcopy
work_dir /var/tmp/tarn-compact-time compact-time
SRV=
trap '[ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$W"' EXIT

# one LABEL BINARY: prints "LABEL extents compact_s read_s ratio moved_MiB"
one() {
  local label=$1 bin=$2 d=$W/$1 uri t0 t1 t2 rc
  mkdir -p "$d"
  append_volume_served "$bin" "$d" "$SIZE"
  uri=$URI
  fio --ioengine=nbd "--uri=$uri" --name=scatter --rw=randwrite --bs=4k --iodepth=32 "--size=$SIZE" --randseed=7 --output=/dev/null
  "$bin" snap create bench@s1 -p "$d/pool.img" >/dev/null
  local extents
  extents=$("$bin" vol list -p "$d/pool.img" --json | python3 -c 'import json,sys; print([v for v in json.load(sys.stdin) if v["name"]=="bench"][0]["extents"])')
  t0=$(date +%s.%N)
  nbdcopy "$uri" null:
  t1=$(date +%s.%N)
  rc=0
  timeout "$LIMIT" "$bin" pool compact -p "$d/pool.img" --json >"$d/compact.json" 2>/dev/null || rc=$?
  t2=$(date +%s.%N)
  stop_pids 60 "$SRV"; SRV=
  python3 - "$label" "$extents" "$t0" "$t1" "$t2" "$rc" "$d/compact.json" <<'PY'
import json, sys
label, extents, t0, t1, t2, rc, path = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:6]), int(sys.argv[6]), sys.argv[7]
read, compact = t1 - t0, t2 - t1
moved = "-"
if rc == 0:
    v = [v for v in json.load(open(path))["volumes"] if v["volume"] == "bench"][0]
    moved = f"{(v['moved_bytes'] + v['snapshot_moved_bytes']) / 2**20:.0f}"
state = "" if rc == 0 else f"  (stopped by the {int(compact)} s limit)" if rc == 124 else f"  (failed, exit {rc})"
print(f"{label:<10} {extents:>8} {compact:>10.2f} {read:>8.2f} {compact / read:>8.1f}x {moved:>9}{state}")
PY
  rm -rf "$d"
}

{
  echo "tarn compact time $(date -u +%F\ %T): volume $((SIZE >> 20)) MiB written once in random 4 KiB order (append), one snapshot, then pool compact"
  echo "TARN=$TARN${TARN_BASE:+ TARN_BASE=$TARN_BASE}; load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "binary      extents  compact_s   read_s  compact/read  moved_MiB"
  for r in $(seq 1 "$ROUNDS"); do
    [ -n "${TARN_BASE:-}" ] && one "base-r$r" "$TARN_BASE"
    one "tarn-r$r" "$TARN"
  done
} | tee "$OUT"
echo "results: $OUT"

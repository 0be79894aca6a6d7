#!/usr/bin/env bash
# The placement issue's real workload (VC Tables 1-3 on a real file
# system): ext4 on a tarn volume through nbdfuse + loop, aged over DAYS
# simulated days (a source tree unpacked, older files edited, the oldest
# tree deleted, large files rewritten whole or in part, a snapshot at each
# day's end; bench/ext4_days.py), with the requests recorded
# (`serve --trace`). Then, per placement:
#   - measured: every file's blocks (filefrag) mapped through the live
#     volume's map (`tarn vol map`): seeks per file read in order, over
#     all files and over files rewritten after a snapshot;
#   - simulated: `tarn trace replay` of the same trace with a snapshot per
#     day and the same file list: seeks, density, read time.
# The idle compactor is off, so the figures are the placement's own.
# Needs root (loop, mount), nbdfuse, e2fsprogs (filefrag).
#
#   bash bench/ext4_days.sh
# A policy `contiguous+random` is contiguous with VC's random start
# (`--region-start random`).
# Env: POLICIES="linear contiguous contiguous+random" DAYS=6 DAY_SECS=20 VOL_SIZE=3G DIR=/var/tmp/tarn-ext4days
# Output: bench/results/<date>-ext4days.txt
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$BENCH/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
POLICIES=${POLICIES:-linear contiguous contiguous+random}
DAYS=${DAYS:-6}
DAY_SECS=${DAY_SECS:-20}
VOL_SIZE=${VOL_SIZE:-3G}
DIR=${DIR:-/var/tmp/tarn-ext4days}
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
OUT=$BENCH/results/$STAMP-ext4days.txt
SYSPY=/usr/bin/python3
PORT=${PORT:-10877}
VOL=fs
for c in nbdfuse fusermount3 losetup mkfs.ext4 filefrag nbdinfo; do
  command -v $c >/dev/null || { echo "ext4_days: $c missing, run: bash scripts/deps.sh" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "ext4_days: needs root (loop device, mount)" >&2; exit 1; }
[ -x "$TARN" ] || { echo "ext4_days: $TARN not built (cargo build --release -p tarn-cli)" >&2; exit 1; }
mkdir -p "$DIR" "$BENCH/results"
SRV= FUSE_PID= LOOP=
cleanup() {
  set +e
  mountpoint -q "$DIR/mnt" && umount "$DIR/mnt"
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  mountpoint -q "$DIR/fuse" && fusermount3 -u "$DIR/fuse"
  [ -n "$SRV" ] && kill -TERM "$SRV" && wait "$SRV"
  rm -rf "$DIR"/run.*
}
trap cleanup EXIT
exec > >(tee "$OUT") 2>&1

# POLICY[+random] -> the placement, and the start flag for serve and replay
placement() { echo "${1%+random}"; }
start_flag() { case $1 in *+random) echo "--region-start random" ;; esac; }
one_policy() { # POLICY
  local p=$1 run="$DIR/run.$1"
  rm -rf "$run"; mkdir -p "$run/fuse" "$run/mnt"
  local pool=$run/pool.img
  "$TARN" pool create "$pool" --size "$(( $("$SYSPY" -c "print(int('${VOL_SIZE%G}'))") * 3 ))G" >/dev/null
  "$TARN" vol create $VOL --size "$VOL_SIZE" --placement "$(placement "$p")" -p "$pool" >/dev/null
  "$TARN" serve -p "$pool" --listen "127.0.0.1:$PORT" --compact-idle 0 $(start_flag "$p") --trace "$run/trace" >"$run/serve.log" 2>&1 &
  SRV=$!
  for _ in $(seq 100); do nbdinfo --can connect "nbd://127.0.0.1:$PORT/$VOL" 2>/dev/null && break; sleep 0.1; done
  nbdfuse "$run/fuse/disk" "nbd://127.0.0.1:$PORT/$VOL" >"$run/nbdfuse.log" 2>&1 &
  FUSE_PID=$!
  for _ in $(seq 100); do [ -s "$run/fuse/disk" ] && break; sleep 0.1; done
  LOOP=$(losetup -f --show "$run/fuse/disk")
  mkfs.ext4 -q -F -b 4096 "$LOOP"
  mount "$LOOP" "$run/mnt"
  "$SYSPY" "$BENCH/ext4_days.py" age "$run/mnt" "$DAYS" "$DAY_SECS" "$run/written.json" -- \
    "$TARN" snap create "$VOL@day{day}" -p "$pool"
  "$SYSPY" "$BENCH/ext4_days.py" files "$run/mnt" "$run/written.json" "$VOL" "$run/files.json"
  "$TARN" vol map $VOL -p "$pool" --json >"$run/map.json"
  echo "$p measured on the live volume: $("$SYSPY" "$BENCH/ext4_days.py" seeks "$run/files.json" "$run/map.json")"
  echo "$p extents: $("$TARN" vol list -p "$pool" --json | "$SYSPY" -c 'import json,sys;print([v["extents"] for v in json.load(sys.stdin) if v["name"]=="fs"][0])')"
  umount "$run/mnt"; blockdev --flushbufs "$LOOP"; losetup -d "$LOOP"; LOOP=
  fusermount3 -u "$run/fuse"; wait "$FUSE_PID" || true; FUSE_PID=
  kill -TERM "$SRV"; wait "$SRV" || true; SRV=
  cp "$run/trace" "$DIR/trace.$p"; cp "$run/files.json" "$DIR/files.$p.json"
}

echo "tarn ext4 days benchmark $STAMP ($(uname -r), $(nproc) cpus; git $(git -C "$REPO" rev-parse --short HEAD))"
echo "ext4 on a $VOL_SIZE volume, $DAYS days of $DAY_SECS s, a snapshot at each day's end; policies: $POLICIES"
for p in $POLICIES; do one_policy "$p"; done
# The simulator on one recorded trace (the first policy's), every policy.
first=${POLICIES%% *}
for p in $POLICIES; do
  # shellcheck disable=SC2046 # the flag's words
  "$TARN" trace replay "$DIR/trace.$first" --placement "$(placement "$p")" $(start_flag "$p") --snapshot-every "$DAY_SECS" \
    --files "$DIR/files.$first.json" --dir "$DIR" --json >"$DIR/replay.$p.json"
  echo "$p simulated (trace of $first): $("$SYSPY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
f = j.get("files") or {}
print(json.dumps({k: f.get(k) for k in ("all", "rewritten_after_snapshot")}))' "$DIR/replay.$p.json")"
done
echo "results: $OUT"

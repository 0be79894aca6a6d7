#!/usr/bin/env bash
# Placement policies on a real file device and on a modeled spinning disk
# (issue "placement policies"): what AoDI's append and VA's allocate-once,
# update-in-place trade, measured the way the seeds did, on a machine with
# no disk that seeks. `_hdd` targets serve with TARN_BENCH_DISK_MODEL=hdd:
# every pool device delays each request by the seek, half rotation and
# transfer of one 7,200 rpm head, one request at a time
# (crates/engine/src/device/disk_model.rs; the model of `tarn trace replay`).
#
# Per target, on a fresh pool through fio's nbd engine (one connection):
#   1. 4 KiB random first writes, QD32, RAND_SECS seconds (IOPS);
#   2. a 1M sequential write of the whole volume, QD8 (every block mapped);
#   3. 4 KiB random overwrites, QD32, RAND_SECS seconds (IOPS, "aged");
#   4. SNAPS rounds of (snapshot, SNAP_IOS 4 KiB random overwrites);
#   5. the pool file evicted, a 1M sequential read, QD8, at most READ_SECS
#      (MiB/s): the cost of the layout; extents per GiB;
#   6. `tarn pool compact` online, then step 5 again (not on `_hdd`
#      targets unless COMPACT_HDD=1: compaction of data scattered at 4 KiB
#      reads it back one seek per block, ~1 MiB/s on the model).
# Targets: POLICY or POLICY_hdd for POLICY in append inplace linear
# contiguous, and `fresh` / `fresh_hdd`: a twin volume written once in
# order (step 2) and read cold (step 5), the read the others are held
# against (issue: after compaction within 10% of a freshly written one).
# ROUNDS rounds, order rotating; the report gives medians, the range,
# append / inplace per round, and each read / the fresh twin's per round.
#
#   bash bench/slow_disk.sh
# Env: SIZE=1G RAND_SECS=20 SNAPS=10 SNAP_IOS=256 READ_SECS=60 ROUNDS=2 COMPACT_HDD=0
#      TARGETS="append_hdd inplace_hdd append inplace" BENCH_DIR=/var/tmp/tarn-slowdisk
# Output: bench/results/<date>-slowdisk.txt; raw fio JSON in bench/results/raw/<date>-slowdisk/.
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
. "$BENCH/common.sh"
REPO=$(cd "$BENCH/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
SIZE=${SIZE:-1G}
RAND_SECS=${RAND_SECS:-20}
SNAPS=${SNAPS:-10}
SNAP_IOS=${SNAP_IOS:-256}
READ_SECS=${READ_SECS:-60}
ROUNDS=${ROUNDS:-2}
COMPACT_HDD=${COMPACT_HDD:-0}
TARGETS=${TARGETS:-append_hdd inplace_hdd append inplace}
TRANSPORT=tcp
DIR=${BENCH_DIR:-/var/tmp/tarn-slowdisk}
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
RAW=$BENCH/results/raw/$STAMP-slowdisk
OUT=$BENCH/results/$STAMP-slowdisk.txt
SYSPY=/usr/bin/python3
export LC_ALL=C
SIZE_B=$("$SYSPY" -c 'import sys;s=sys.argv[1];m={"K":1<<10,"M":1<<20,"G":1<<30};print(int(s[:-1])*m[s[-1].upper()] if s[-1].upper() in m else int(s))' "$SIZE")
POOL_B=$((SIZE_B * 3))
command -v fio >/dev/null || { echo "slow_disk: fio missing, run: bash scripts/deps.sh" >&2; exit 1; }
[ -x "$TARN" ] || { echo "slow_disk: $TARN not built (cargo build --release -p tarn-cli)" >&2; exit 1; }
for t in $TARGETS; do
  case ${t%_hdd} in append | inplace | linear | contiguous | fresh) ;; *) echo "slow_disk: unknown target $t" >&2; exit 2 ;; esac
done
per_target_setup
. "$BENCH/targets.sh"
. "$BENCH/fio_steps.sh"

setup() { # TARGET
  local policy=${1%_hdd} model=
  [ "$1" != "$policy" ] && model=hdd
  [ "$policy" = fresh ] && policy=linear
  TARN_BENCH_DISK_MODEL=$model TARN_SERVE_ARGS="--placement $policy --compact-idle 0" setup_tarn
}
# TARN_BENCH_DISK_MODEL= (empty) must mean "no model": the server treats
# only a set, non-empty value as a model name.
layout() { # ROUND TARGET PREFIX: cold read of the whole volume (bounded) and extents per GiB
  local r=$1 t=$2 pre=$3 v
  evict "$TGT_DIR/pool.img"
  v=$(fio_job "$r" "$t" "${pre}read" --rw=read --bs=1M --iodepth=8 "--size=$SIZE_B" --runtime="$READ_SECS") &&
    record "$r" "$t" "${pre}read_mibs" "$v"
  v=$(extents_per_gib "$TGT_DIR/pool.img") && record "$r" "$t" "${pre}extents_per_gib" "$v"
}
sequence() { # ROUND TARGET
  local r=$1 t=$2 v s
  TGT_DIR=$(mktemp -d "$DIR/t.$t.XXXX")
  setup "$t" || { log "setup of $t failed"; rm -rf "$TGT_DIR"; return 0; }
  local rand=(--rw=randwrite --bs=4k --iodepth=32 "--size=$SIZE_B" --norandommap --randrepeat=0)
  if [ "${t%_hdd}" = fresh ]; then
    # The twin the others' reads are held against: written once, in order.
    v=$(fio_job "$r" "$t" seqwrite --rw=write --bs=1M --iodepth=8 "--size=$SIZE_B") && record "$r" "$t" seq_write_mibs "$v"
    layout "$r" "$t" ""
    stop_server
    rm -rf "$TGT_DIR"
    return 0
  fi
  v=$(fio_job "$r" "$t" first "${rand[@]}" --time_based "--runtime=$RAND_SECS") && record "$r" "$t" first_write_iops "$v"
  v=$(fio_job "$r" "$t" seqwrite --rw=write --bs=1M --iodepth=8 "--size=$SIZE_B") && record "$r" "$t" seq_write_mibs "$v"
  v=$(fio_job "$r" "$t" overwrite "${rand[@]}" --time_based "--runtime=$RAND_SECS") && record "$r" "$t" overwrite_iops "$v"
  for s in $(seq 1 "$SNAPS"); do
    "$TARN" snap create "bench@s$s" -p "$TGT_DIR/pool.img" >/dev/null || { log "snap create on $t failed"; break; }
    fio_job "$r" "$t" "snapwrite$s" "${rand[@]}" "--io_size=$((SNAP_IOS * 4096))" >/dev/null || break
  done
  layout "$r" "$t" ""
  if [ "$t" = "${t%_hdd}" ] || [ "$COMPACT_HDD" = 1 ]; then
    compact "$r" "$t"
    layout "$r" "$t" compacted_
  fi
  stop_server
  rm -rf "$TGT_DIR"
}

log "slow_disk: targets [$TARGETS], $SIZE, ${RAND_SECS}s random phases, $ROUNDS rounds"
rotate
{
  echo "tarn placement on a file and on a modeled disk $STAMP  ($(uname -r), $(nproc) cpus, fs of $DIR: $(df --output=fstype "$DIR" | tail -1))"
  echo "volume $SIZE; 4K random first writes QD32 ${RAND_SECS}s; 1M sequential write; 4K random overwrites QD32 ${RAND_SECS}s; $SNAPS x (snapshot, $SNAP_IOS 4K random overwrites); cold 1M sequential read QD8 (<= ${READ_SECS}s); pool compact; the read again. _hdd: TARN_BENCH_DISK_MODEL=hdd. $ROUNDS rounds, order rotating"
  echo "git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none)  fio: $(fio --version)"
  echo
  "$SYSPY" "$BENCH/slow_disk_report.py" "$RESULTS"
} | tee "$OUT"
log "results: $OUT (raw in $RAW)"

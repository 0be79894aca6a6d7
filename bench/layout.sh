#!/usr/bin/env bash
# Layout benchmark (issue "sequential data stays sequential"): what a volume
# first written at random reads like afterwards. Per target, on a fresh
# volume, through fio's nbd engine (one connection):
#   1. 4 KiB random first writes, QD32, for RAND_SECS seconds (IOPS);
#   2. one 1M sequential overwrite of the whole volume, QD8;
#   3. the target's backing file evicted from the page cache (fdatasync +
#      POSIX_FADV_DONTNEED on that file only, never the whole cache);
#   4. a 1M sequential read of the whole volume, QD8 (cold), and again (warm);
#   5. tarn: extents per GiB and free space outside whole 256 KiB regions;
#   6. tarn: SNAPS rounds of (snapshot, 4 KiB random overwrites of SNAP_PCT
#      percent of the volume, QD32), then the cold and warm reads again,
#      as a ratio to the same target's reads with no snapshots (step 4).
# Targets: tarn (default placement, linear), tarn_b (the same with the
# build TARN_B: a before/after comparison in one run), tarn_contiguous (--placement
# contiguous), tarn_compact (default placement; step 2 is `tarn pool
# compact` online instead of the overwrite: an existing volume re-laid
# out), nbdkit (file plugin, raw sparse file), qemu (qemu-nbd, qcow2,
# cache=none). ROUNDS rounds, the order rotating per round; the report
# gives medians, the range, and ratios to nbdkit.
#
#   bash bench/layout.sh
# Env: SIZE=4G RAND_SECS=10 ROUNDS=3 TARGETS="tarn tarn_contiguous tarn_compact nbdkit qemu"
#      SNAPS=10 SNAP_PCT=1 BENCH_DIR=/var/tmp/tarn-layout TRANSPORT=tcp TARN=target/release/tarn TARN_B=
# Output: bench/results/<date>-layout.txt; raw fio JSON in bench/results/raw/<date>-layout/.
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
. "$BENCH/common.sh"
REPO=$(cd "$BENCH/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
SIZE=${SIZE:-4G}
RAND_SECS=${RAND_SECS:-10}
ROUNDS=${ROUNDS:-3}
TARGETS=${TARGETS:-tarn tarn_contiguous tarn_compact nbdkit qemu}
SNAPS=${SNAPS:-10}
SNAP_PCT=${SNAP_PCT:-1}
TRANSPORT=${TRANSPORT:-tcp}
DIR=${BENCH_DIR:-/var/tmp/tarn-layout}
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
RAW=$BENCH/results/raw/$STAMP-layout
OUT=$BENCH/results/$STAMP-layout.txt
SYSPY=/usr/bin/python3
export LC_ALL=C
SIZE_B=$("$SYSPY" -c 'import sys;s=sys.argv[1];m={"K":1<<10,"M":1<<20,"G":1<<30};print(int(s[:-1])*m[s[-1].upper()] if s[-1].upper() in m else int(s))' "$SIZE")
POOL_B=$((SIZE_B * 2))
for c in fio qemu-img qemu-nbd nbdkit nbdinfo; do
  command -v $c >/dev/null || { echo "layout: $c missing, run: bash scripts/deps.sh" >&2; exit 1; }
done
[ -x "$TARN" ] || { echo "layout: $TARN not built (cargo build --release -p tarn-cli)" >&2; exit 1; }
per_target_setup
. "$BENCH/targets.sh"
setup_tarn_contiguous() { TARN_SERVE_ARGS="--placement contiguous" setup_tarn; }
setup_tarn_compact() { setup_tarn; }

# The file under the target's volume: evict it, and only it.
backing_file() {
  case $1 in
    tarn*) echo "$TGT_DIR/pool.img" ;;
    nbdkit) echo "$TGT_DIR/disk.raw" ;;
    qemu) echo "$TGT_DIR/disk.qcow2" ;;
  esac
}
. "$BENCH/fio_steps.sh"
reads() { # ROUND TARGET METRIC-PREFIX: evict, then cold and warm 1M sequential reads
  local r=$1 t=$2 pre=$3 v
  evict "$(backing_file "$t")"
  v=$(fio_job "$r" "$t" "${pre}coldread" --rw=read --bs=1M --iodepth=8 "--size=$SIZE_B") && record "$r" "$t" "${pre}cold_read_mibs" "$v"
  v=$(fio_job "$r" "$t" "${pre}warmread" --rw=read --bs=1M --iodepth=8 "--size=$SIZE_B") && record "$r" "$t" "${pre}warm_read_mibs" "$v"
}
snapshots() { # ROUND TARGET: SNAPS x (snapshot + random overwrites), then the reads again
  local r=$1 t=$2 s v
  for s in $(seq 1 "$SNAPS"); do
    "$TARN" snap create "bench@s$s" -p "$TGT_DIR/pool.img" >/dev/null || { log "snap create on $t failed"; return 0; }
    v=$(fio_job "$r" "$t" "snapwrite$s" --rw=randwrite --bs=4k --iodepth=32 "--size=$SIZE_B" \
      "--io_size=$((SIZE_B * SNAP_PCT / 100))" --norandommap --randrepeat=0) || return 0
    # Copy-on-write rate (every overwrite lands on a block a snapshot
    # shares) after the first snapshot and after the last.
    [ "$s" = 1 ] && record "$r" "$t" snap1_write_iops "$v"
    [ "$s" = "$SNAPS" ] && record "$r" "$t" snapn_write_iops "$v"
  done
  reads "$r" "$t" snap_
}

# Server CPU ticks (utime + stime, exited threads included); 0 without a server.
server_ticks() { if [ -n "$SRV_PID" ]; then awk '{print $14 + $15}' "/proc/$SRV_PID/stat"; else echo 0; fi; }
rand_write_detail() { # ROUND TARGET TICKS: server CPU us per request and completion latency p99 of step 1
  local v
  v=$("$SYSPY" - "$RAW/$2.r$1.randwrite.json" "$3" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
w = json.load(open(sys.argv[1]))["jobs"][0]["write"]
print(int(sys.argv[2]) * 1e6 / int(sys.argv[3]) / max(w["total_ios"], 1), w["clat_ns"]["percentile"]["99.000000"] / 1000)
EOF
  ) || return 0
  record "$1" "$2" rand_write_cpu_us "${v% *}"
  record "$1" "$2" rand_write_p99_us "${v#* }"
}

sequence() { # ROUND TARGET
  local r=$1 t=$2 v
  TGT_DIR=$(mktemp -d "$DIR/t.$t.XXXX")
  "setup_$t" || { log "setup of $t failed"; rm -rf "$TGT_DIR"; return 0; }
  local c0; c0=$(server_ticks)
  v=$(fio_job "$r" "$t" randwrite --rw=randwrite --bs=4k --iodepth=32 --time_based "--runtime=$RAND_SECS" \
      "--size=$SIZE_B" --norandommap --randrepeat=0) && record "$r" "$t" rand_write_iops "$v" &&
    rand_write_detail "$r" "$t" "$(($(server_ticks) - c0))"
  if [ "$t" = tarn_compact ]; then
    compact "$r" "$t"
  else
    v=$(fio_job "$r" "$t" seqwrite --rw=write --bs=1M --iodepth=8 "--size=$SIZE_B") && record "$r" "$t" seq_write_mibs "$v"
  fi
  reads "$r" "$t" ""
  if [[ $t == tarn* ]]; then
    local pool=$TGT_DIR/pool.img
    v=$(extents_per_gib "$pool") && record "$r" "$t" extents_per_gib "$v"
    v=$("$TARN" pool status -p "$pool" --json | "$SYSPY" -c 'import json,sys;print(json.load(sys.stdin).get("free_outside_regions", -1) / (1 << 20))') &&
      record "$r" "$t" free_outside_regions_mib "$v"
    [ "$SNAPS" -gt 0 ] && snapshots "$r" "$t"
  fi
  stop_server
  rm -rf "$TGT_DIR"
}

log "layout: targets [$TARGETS], $SIZE, random first writes ${RAND_SECS}s, $ROUNDS rounds"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
rotate
{
  echo "tarn layout benchmark $STAMP  ($(uname -r), $(nproc) cpus, fs of $DIR: $(df --output=fstype "$DIR" | tail -1))"
  echo "volume $SIZE; 4K random first writes QD32 for ${RAND_SECS}s, 1M sequential overwrite QD8 (tarn_compact: tarn pool compact), backing file evicted, 1M sequential read QD8 cold then warm; tarn: then $SNAPS x (snapshot, 4K random overwrites of $SNAP_PCT% of the volume) and the reads again; $ROUNDS rounds, order rotating"
  echo "git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none)  fio: $(fio --version)  TARN=$TARN${TARN_B:+  TARN_B=$TARN_B}"
  echo "load at start: $LOAD0; at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  "$SYSPY" "$BENCH/layout_report.py" "$RESULTS"
} | tee "$OUT"
log "results: $OUT (raw in $RAW)"

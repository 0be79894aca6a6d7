#!/usr/bin/env bash
# Where a volume's blocks lie after `tarn pool compact`, against a freshly
# written twin, without timing anything: the sequence of bench/slow_disk.sh
# (4K random writes, a 1M sequential pass, 4K random overwrites, SNAPS x
# (snapshot, 256 random overwrites)) on a pool file 3x the volume, then
# `pool compact` and `vol map` of the head; the twin is written once in
# order. Per layout: the gaps a read in logical order meets (by size) and
# the read time of the whole volume by the disk model of `tarn trace
# replay` (equation 1 of the VC paper: a seek of 0.5 ms + 7.5 ms x
# sqrt(distance / device) + 4.17 ms per discontiguity that is not a
# forward gap under 256 KiB, gaps read through, 150 MB/s). The fio read on
# the modeled disk (bench/slow_disk.sh COMPACT_HDD=1) varies too much from
# run to run to tell 0.9x from 1.0x; this does not vary with load. Under
# each compacted line, what the compaction moved (head, the span cleared
# for it first, snapshots' data, regions cleaned): its cost.
#
#   bash bench/compact_layout.sh      env: TARN=<binary> SIZE_MIB=64 RAND_SECS=3 SNAPS=10 ROUNDS=2
# Output: bench/results/<date>-compact-layout.txt
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
source "$REPO/bench/common.sh"
TARN=${TARN:-$REPO/target/release/tarn}
SIZE=$((${SIZE_MIB:-64} << 20))
RAND_SECS=${RAND_SECS:-3}
SNAPS=${SNAPS:-10}
ROUNDS=${ROUNDS:-2}
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
OUT=$REPO/bench/results/$STAMP-compact-layout.txt
WORK=$(mktemp -d /var/tmp/tarn-compact-layout.XXXX)
SRV=
trap '[ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$WORK"' EXIT
command -v fio >/dev/null && command -v nbdinfo >/dev/null || { echo "compact_layout: fio and nbdinfo needed (bash scripts/deps.sh)" >&2; exit 1; }
[ -x "$TARN" ] || { echo "compact_layout: $TARN not built" >&2; exit 1; }

# sequence DIR fresh|aged: leaves DIR/head.map (lba len device block per line)
sequence() {
  local d=$1 kind=$2 uri s
  mkdir -p "$d"
  append_volume_served "$TARN" "$d" "$SIZE"
  uri=$URI
  local fio=(fio --ioengine=nbd "--uri=$uri" --numjobs=1 --output=/dev/null)
  local rand=(--rw=randwrite --bs=4k --iodepth=32 "--size=$SIZE" --norandommap --randrepeat=0)
  if [ "$kind" = aged ]; then
    "${fio[@]}" --name=first "${rand[@]}" --time_based "--runtime=$RAND_SECS"
  fi
  "${fio[@]}" --name=seq --rw=write --bs=1M --iodepth=8 "--size=$SIZE"
  if [ "$kind" = aged ]; then
    "${fio[@]}" --name=over "${rand[@]}" --time_based "--runtime=$RAND_SECS"
    for s in $(seq 1 "$SNAPS"); do
      "$TARN" snap create "bench@s$s" -p "$d/pool.img" >/dev/null
      "${fio[@]}" --name="snap$s" "${rand[@]}" "--io_size=$((256 * 4096))"
    done
    "$TARN" pool compact -p "$d/pool.img" --json >"$d/compact.json"
  fi
  "$TARN" vol map -p "$d/pool.img" bench >"$d/head.map"
  kill "$SRV"; wait "$SRV" 2>/dev/null || true; SRV=
}

report() { # LABEL MAP POOL_BLOCKS
  python3 - "$@" <<'PY'
import math, sys
label, path, device = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = sorted(tuple(map(int, l.split())) for l in open(path) if l.strip())
gaps = {"1-4": 0, "5-63": 0, "64-255": 0, ">=256 or back": 0}
head, ms, seeks, blocks = None, 0.0, 0, 0
for lba, n, dev, block in runs:
    if head is not None and block != head:
        g = block - head
        gaps["1-4" if 0 < g <= 4 else "5-63" if 0 < g < 64 else "64-255" if 0 < g < 256 else ">=256 or back"] += 1
    if head is None or not (0 <= block - head < 64):
        ms += 0.5 + 7.5 * math.sqrt(abs(block - (head or 0)) / device) + 4.17
        seeks += 1
        read = n
    else:
        read = n + block - head
    ms += read * 4096 / 150e6 * 1000
    head, blocks = block + n, blocks + n
mib = blocks * 4096 / 2**20
print(f"{label:<14} {len(runs):>7} {sum(gaps.values()):>6}  {gaps['1-4']:>5} {gaps['5-63']:>5} {gaps['64-255']:>6} {gaps['>=256 or back']:>6}  {seeks:>5}  {ms / 1000:7.3f} s  {mib / (ms / 1000):6.1f} MiB/s")
PY
}

moved() { # COMPACT_JSON: what the compaction moved (its cost)
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
v = r["volumes"][0]
mib = lambda b: b / 2**20
regions = r.get("regions") or {}
print(f"  moved: head {mib(v['moved_bytes']):.1f} MiB, span cleared first {mib(v.get('cleared_bytes', 0)):.1f} MiB, "
      f"snapshots {mib(v['snapshot_moved_bytes']):.1f} MiB, regions cleaned {mib(regions.get('moved_bytes', 0)):.1f} MiB")
PY
}

{
  echo "tarn compact layout $STAMP: $(basename "$TARN") ($("$TARN" --version)), volume $((SIZE >> 20)) MiB on a pool 3x, append,"
  echo "random phases ${RAND_SECS}s, $SNAPS snapshots; gaps in the head read in logical order (blocks), modeled read of the volume"
  echo "layout          entries   gaps    1-4  5-63 64-255 >=256/back seeks   modeled read"
  for r in $(seq 1 "$ROUNDS"); do
    sequence "$WORK/aged$r" aged
    report "compacted r$r" "$WORK/aged$r/head.map" $((SIZE * 3 / 4096))
    moved "$WORK/aged$r/compact.json"
    sequence "$WORK/fresh$r" fresh
    report "fresh r$r" "$WORK/fresh$r/head.map" $((SIZE * 3 / 4096))
    rm -rf "$WORK/aged$r" "$WORK/fresh$r"
  done
} | tee "$OUT"
echo "results: $OUT"

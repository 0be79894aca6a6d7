#!/usr/bin/env bash
# Metadata-store comparison (bench/metastore/, its own cargo workspace): the
# aging workload at the metadata level, per backend: N random 4K-write extent
# inserts over a 64 GiB volume, a durable commit every 256; commit latency,
# inserts/s, lookups/s, memory, device bytes per extent, reopen time (fresh
# process, page cache dropped). Backends run alternately, ROUNDS rounds per N;
# the report gives the median and the range of the rounds. Not part of the tests.
#
#   bash bench/metastore.sh
# builds with `cargo build --release --manifest-path bench/metastore/Cargo.toml
# --features tarn-store` (backend tarn: tarn's own B-tree, crates/store, with a
# per-commit log record and incremental checkpoints; see src/tarn_store.rs).
# Env:
#   NS="1M"                 insert counts (e.g. "1M 10M")
#   BACKENDS="btreemap redb tarn"
#   ROUNDS=3
#   ARGS=""                 more options for the binary (--cache-mib 256,
#                           --checkpoint-mib 64, --dirty-nodes 16384 (tarn),
#                           --vol-blocks, --lookups ...)
#   BENCH_DIR=/var/tmp/tarn-metastore   scratch
# Output: bench/results/<date>-metastore.txt; raw output in
# bench/results/raw/<date>-metastore/ (gitignored).
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$BENCH/.." && pwd)
NS=${NS:-1M}
BACKENDS=${BACKENDS:-btreemap redb tarn}
ROUNDS=${ROUNDS:-3}
ARGS=${ARGS:-}
DIR=${BENCH_DIR:-/var/tmp/tarn-metastore}
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
RAW=$BENCH/results/raw/$STAMP-metastore
OUT=$BENCH/results/$STAMP-metastore.txt
export LC_ALL=C
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }

mkdir -p "$DIR" "$RAW"
trap 'rm -rf "$DIR"' EXIT
cargo build -q --release --manifest-path "$BENCH/metastore/Cargo.toml" --features tarn-store
BIN=$DIR/metastore-bench
cp "$BENCH/metastore/target/release/tarn-metastore-bench" "$BIN"

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
read -r -a B_ARR <<<"$BACKENDS"
nb=${#B_ARR[@]}
j=0
for n in $NS; do
  for r in $(seq 1 "$ROUNDS"); do
    for k in $(seq 0 $((nb - 1))); do
      b=${B_ARR[$(((j + k) % nb))]}   # alternate the order per round
      l0=$(cut -d' ' -f1 /proc/loadavg)
      log "$b n=$n round $r (load $l0)"
      # shellcheck disable=SC2086
      "$BIN" "$b" "$DIR" --n "$n" $ARGS >"$RAW/$b.$n.r$r.txt" 2>&1 || log "$b n=$n failed: $(tail -2 "$RAW/$b.$n.r$r.txt")"
      printf 'LOAD %s %s\n' "$l0" "$(cut -d' ' -f1 /proc/loadavg)" >>"$RAW/$b.$n.r$r.txt"
      rm -rf "${DIR:?}/$b"
    done
    j=$((j + 1))
  done
done

{
  echo "tarn metadata-store comparison $STAMP  ($(uname -r), $(nproc) cpus, $(free -g | awk '/^Mem:/ {print $2}') GiB RAM, fs of $DIR: $(df --output=fstype "$DIR" | tail -1))"
  echo "workload: N extent inserts (random lba over 64 GiB of 4K blocks, pba sequential), durable commit every 256, then lookups of written blocks; $ROUNDS round(s), backends alternating; extra args: [${ARGS}]"
  echo "redb $(grep -A1 'name = "redb"' "$BENCH/metastore/Cargo.lock" | sed -n 's/version = "\(.*\)"/\1/p') over a StorageBackend on a plain file (pread/pwrite/fdatasync); btreemap: std BTreeMap + a log record per commit + whole-map checkpoint when the log passes 64 MiB (today's engine's shape); tarn: crates/store ExtentTree (cache = --cache-mib) + a log record per commit + incremental checkpoint (dirty nodes written, root record) when dirty nodes pass --dirty-nodes (default 16384) or the log passes --checkpoint-mib (default 64) (the engine's planned shape)"
  echo "git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none)  load at start: $LOAD_START, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  /usr/bin/python3 "$BENCH/metastore_report.py" "$RAW"
} | tee "$OUT"
log "results: $OUT (raw output in $RAW)"

#!/usr/bin/env bash
# Side-by-side benchmark: tarn serve vs qemu-nbd (qcow2) vs nbdkit file (raw)
# vs fio directly on a raw file, all through fio (nbd engine for the three
# servers, io_uring/libaio + O_DIRECT for the raw file). Not part of the tests.
#
#   bash bench/run.sh
# Env:
#   BENCH_RUNTIME=20        seconds per measured run (time_based)
#   BENCH_SIZE=2G           volume / image size
#   BENCH_TARGETS="tarn qemu nbdkit raw"   (also: tarn_nosum = tarn without data checksums)
#   BENCH_WORKLOADS="rw4k_fresh rw4k_alloc rr4k sw1m sr1m rw4k_fsync"
#   BENCH_TRANSPORT=tcp     tcp (127.0.0.1) or unix socket for the NBD servers
#   BENCH_DIR=/var/tmp/tarn-bench   scratch space (needs ~2x BENCH_SIZE free)
#   BENCH_META=1            also measure tarn metadata bytes per byte written
#   TARN=target/release/tarn
#   TARN_B=path/to/another/tarn   target tarn_b: the same setup with that binary
#                                 (before/after twin runs; ratios are tarn / tarn_b)
# Output: a table on stdout, also written to bench/results/<date>.txt; raw
# fio JSON goes to bench/results/raw/<date>/ (gitignored).
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
. "$BENCH/common.sh"
REPO=$(cd "$BENCH/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
RUNTIME=${BENCH_RUNTIME:-20}
SIZE=${BENCH_SIZE:-2G}
TARGETS=${BENCH_TARGETS:-tarn qemu nbdkit raw}
WORKLOADS=${BENCH_WORKLOADS:-rw4k_fresh rw4k_alloc rr4k sw1m sr1m rw4k_fsync}
TRANSPORT=${BENCH_TRANSPORT:-tcp}
DIR=${BENCH_DIR:-/var/tmp/tarn-bench}
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
RAW=$BENCH/results/raw/$STAMP
OUT=$BENCH/results/$STAMP.txt
SYSPY=/usr/bin/python3
export LC_ALL=C

bytes() { "$SYSPY" -c 'import sys;s=sys.argv[1];m={"K":1<<10,"M":1<<20,"G":1<<30,"T":1<<40};print(int(s[:-1])*m[s[-1].upper()] if s[-1].upper() in m else int(s))' "$1"; }
SIZE_B=$(bytes "$SIZE")
POOL_B=$((SIZE_B * 2))

for c in fio qemu-img qemu-nbd nbdkit nbdinfo; do
  command -v $c >/dev/null || { echo "bench: $c missing, run: bash scripts/deps.sh" >&2; exit 1; }
done
need_plots bench
if [[ " $TARGETS " == *" tarn "* ]] && ! [ -x "$TARN" ]; then
  echo "bench: $TARN not built (cargo build --release -p tarn-cli): skipping the tarn target" >&2
  TARGETS=${TARGETS//tarn/}
fi

mkdir -p "$DIR" "$RAW"
MANIFEST=$RAW/manifest.tsv
: >"$MANIFEST"
PIDS=()
SRV_PID=
cleanup() {
  set +e
  stop_pids 10 "${PIDS[@]}"
  rm -rf "$DIR"/t.*
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. "$BENCH/targets.sh"
teardown() {
  if [ -n "$SRV_PID" ]; then
    kill -TERM "$SRV_PID" 2>/dev/null || true
    local i; for i in $(seq 1 600); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$SRV_PID" 2>/dev/null && { log "server $SRV_PID ignored SIGTERM for 60s, killing"; kill -KILL "$SRV_PID"; }
    wait "$SRV_PID" 2>/dev/null || true
    SRV_PID=
  fi
  rm -rf "$TGT_DIR"
}

# --- workloads ---------------------------------------------------------------
# name -> "state|fio args"; state fresh = new empty target, alloc = prefilled
declare -A WL=(
  [rw4k_fresh]="fresh|--rw=randwrite --bs=4k --iodepth=32"
  [rw4k_alloc]="alloc|--rw=randwrite --bs=4k --iodepth=32"
  [rr4k]="alloc|--rw=randread --bs=4k --iodepth=32"
  [sw1m]="fresh|--rw=write --bs=1M --iodepth=8"
  [sr1m]="alloc|--rw=read --bs=1M --iodepth=8"
  # replayed from a generated iolog (gen_iolog.py): fio's own --fsync=32 at
  # QD32 issues nearly one flush per write, not one per 32
  [rw4k_fsync]="fresh|IOLOG"
)
COMMON=(--time_based "--runtime=$RUNTIME" --ramp_time=0 --numjobs=1 "--size=$SIZE_B"
        --norandommap --randrepeat=0 --group_reporting --output-format=json)

run_one() { # WORKLOAD TARGET
  local wl=$1 tgt=$2 spec state args
  spec=${WL[$wl]}; state=${spec%%|*}; args=${spec#*|}
  TGT_DIR=$(mktemp -d "$DIR/t.$tgt.XXXX")
  if ! "setup_$tgt"; then log "setup of $tgt failed"; printf '%s\t%s\t%s\t%s\n' "$wl" "$tgt" "-" 0 >>"$MANIFEST"; teardown; return 0; fi
  if [ "$state" = alloc ]; then
    timeout 600 fio --name=prefill "${FIO_TARGET[@]}" --rw=write --bs=1M --iodepth=8 "--size=$SIZE_B" \
      --output="$RAW/$wl.$tgt.prefill.json" --output-format=json >/dev/null 2>&1 || log "prefill of $tgt failed"
  fi
  drop_caches
  local js=$RAW/$wl.$tgt.json rc=0 common=("${COMMON[@]}")
  if [ "$args" = IOLOG ]; then
    # 4k random writes with a flush after every 32, QD32; enough for RUNTIME at 100k IOPS
    local fname=nbd; [ "$tgt" = raw ] && fname=$TGT_DIR/disk.raw
    "$SYSPY" "$BENCH/gen_iolog.py" "$fname" "$SIZE_B" $((RUNTIME * 100000)) 32 "$TGT_DIR/fsync.iolog"
    args="--iodepth=32 --read_iolog=$TGT_DIR/fsync.iolog"
    common=("--runtime=$RUNTIME" --numjobs=1 --group_reporting --output-format=json)
  fi
  # shellcheck disable=SC2086
  timeout $((RUNTIME + 180)) fio --name="$wl" "${FIO_TARGET[@]}" $args "${common[@]}" --output="$js" >"$RAW/$wl.$tgt.out" 2>&1 || rc=$?
  [ $rc -eq 0 ] || { log "fio $wl on $tgt exit $rc: $(tail -2 "$RAW/$wl.$tgt.out" | tr '\n' ' ')"; js=-; }
  local hwm=0; [ -n "$SRV_PID" ] && hwm=$(hwm_kb "$SRV_PID")
  printf '%s\t%s\t%s\t%s\n' "$wl" "$tgt" "$js" "$hwm" >>"$MANIFEST"
  teardown
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
log "bench: targets [$TARGETS], workloads [$WORKLOADS], size $SIZE, runtime ${RUNTIME}s, transport $TRANSPORT"
read -r -a T_ARR <<<"$TARGETS"
i=0
for wl in $WORKLOADS; do
  [ -n "${WL[$wl]:-}" ] || { log "unknown workload $wl"; continue; }
  n=${#T_ARR[@]}
  for k in $(seq 0 $((n - 1))); do
    tgt=${T_ARR[$(((i + k) % n))]}   # rotate the order per workload
    log "$wl on $tgt"
    run_one "$wl" "$tgt"
  done
  i=$((i + 1))
done

# --- tarn metadata overhead + memory -----------------------------------------
META=$RAW/meta.tsv
: >"$META"
if [[ " $TARGETS " == *" tarn "* ]] && [ "${BENCH_META:-1}" = 1 ]; then
  for kind in seq rand; do
    log "tarn metadata: $kind fill of $SIZE"
    TGT_DIR=$(mktemp -d "$DIR/t.meta.XXXX")
    if setup_tarn; then
      if [ $kind = seq ]; then fill=(--rw=write --bs=1M --iodepth=8)
      else fill=(--rw=randwrite --bs=4k --iodepth=32); fi   # random map: every 4k block once
      timeout 1200 fio --name=fill "${FIO_TARGET[@]}" "${fill[@]}" "--size=$SIZE_B" --output-format=json \
        --output="$RAW/meta.$kind.json" >/dev/null 2>&1 || log "fill failed"
      hwm=$(hwm_kb "$SRV_PID")
      kill -TERM "$SRV_PID"; for _ in $(seq 1 600); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
      wait "$SRV_PID" 2>/dev/null || true; SRV_PID=
      st=$(timeout 120 "$TARN" pool status -p "$TGT_DIR/pool.img" --json 2>&1 || true)
      du_b=$(du -B1 "$TGT_DIR/pool.img" | cut -f1)
      written=$("$SYSPY" -c 'import json,sys;print(sum(j["write"]["io_bytes"] for j in json.load(open(sys.argv[1]))["jobs"]))' "$RAW/meta.$kind.json" 2>/dev/null || echo 0)
      printf '%s\t%s\t%s\t%s\t%s\n' "$kind" "$written" "$du_b" "$hwm" "$(printf '%s' "$st" | tr -d '\n\t')" >>"$META"
    fi
    teardown
  done
fi

{
  echo "tarn benchmark $STAMP  ($(uname -r), $(nproc) cpus, fs of $DIR: $(df --output=fstype "$DIR" | tail -1))"
  echo "size $SIZE, runtime ${RUNTIME}s per run, numjobs=1, transport $TRANSPORT; qemu-nbd: qcow2 --cache=none --aio=$QEMU_AIO --discard=unmap;"
  echo "nbdkit: file plugin, raw sparse file, default (page-cache) mode; raw: fio ${RAW_ENGINE:-io_uring} direct=1 on a sparse file"
  echo "4K randwrite fsync=32: replayed fio iolog, one flush (fsync for raw-file) after every 32 writes, QD32"
  echo "git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none)  fio: $(fio --version)  load at start: $LOAD_START, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  "$SYSPY" "$BENCH/report.py" "$MANIFEST" "$META"
} | tee "$OUT"
plots run "$MANIFEST" "${OUT%.txt}"
log "results: $OUT and its plots ${OUT%.txt}-*.png (raw fio json in $RAW)"

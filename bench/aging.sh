#!/usr/bin/env bash
# Aging benchmark: 4 KiB random writes at QD32 with an NBD FLUSH after every
# 256, over one thin volume for DURATION seconds, so that the map ends with
# ~10 M extents (tarn makes one extent per non-adjacent 4K write). Then the
# server is stopped cleanly (SIGTERM: tarn checkpoints) and reopened, and the
# admin commands are timed on the aged pool. The same job (the same fio iolog)
# runs against qemu-nbd on a qcow2 image (--cache=writeback) for the same
# time. Not part of the tests.
#
#   bash bench/aging.sh                 # 10 minutes per target
#   DURATION=90 VOL_SIZE=16G bash bench/aging.sh    # a quick check
#
# Per target:
#   during the run  fio iops log and clat log, one value per second (clat: the
#                   slowest write of that second); VmRSS/VmHWM of the server
#                   from /proc every SAMPLE seconds
#   after the run   SIGTERM -> exit (stop), start -> first NBD answer (open,
#                   polled every 10 ms), through the running server: vol list
#                   and pool status (extents, metadata bytes); offline: vol
#                   list (pool open included) and pool check. qemu-nbd's peers:
#                   qemu-nbd stop/start, qemu-img info, qemu-img check.
# fio's own --fsync=256 at QD32 sends one FLUSH per ~8 writes (fio 3.33), so
# the job replays an iolog (bench/gen_iolog.py: random 4K offsets, seed 32,
# a sync line after every 256 writes; fio's nbd engine sends a sync as
# NBD_CMD_FLUSH) with --runtime=DURATION.
# Env:
#   DURATION=600          seconds per target
#   VOL_SIZE=56G          volume / image size (the writes are spread over it:
#                         distinct 4K blocks written ~= extents = V(1-e^(-W/V))
#                         for W writes over V blocks: 56 GiB at ~30k IOPS for
#                         600 s is ~10.5 M). Needs that much free disk: the
#                         live data is what it is, and the qcow2 is written in
#                         full (QEMU_PREALLOC).
#   POOL_SIZE=2*VOL_SIZE  tarn's sparse pool file
#   TARGETS="tarn qemu"
#   ROUNDS=1              rounds; the target order alternates per round and the
#                         report gives the median and the range of the rounds
#   SAMPLE=5              seconds between memory samples
#   FLUSH_EVERY=256  QD=32
#   QEMU_PREALLOC=full   qcow2 preallocation (off|metadata|falloc|full). full by
#                         default: on a sparse qcow2 random 4K writes leave the
#                         image file in millions of ext4 extents (each new
#                         cluster is a 4K write plus a ZERO_RANGE for the rest),
#                         and on an fs mounted with -o discard (as here) deleting
#                         it discards extent by extent: >10 min for an 8 GiB
#                         image after a 90 s run. full = the image written once
#                         before the run: qcow2 then writes in place (no cluster
#                         allocation), the easier job for the peer.
#   IOLOG_RATE=80000      writes per second the iolog holds (fio stops early if
#                         a target is faster than this)
#   OUT=bench/results/raw/<date>-aging   raw files (fio JSON and logs, samples)
#   RESULT=bench/results/<date>-aging.txt, beside it <date>-aging-iops.png
#                         (IOPS per second and per minute over the run) and
#                         -latency.png (write latency CDF), bench/plots.py
#   BENCH_DIR=/var/tmp/tarn-aging        scratch (pool file / image, iolog)
#   TARN=target/release/tarn  (copied into BENCH_DIR at start)
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
. "$BENCH/common.sh"
REPO=$(cd "$BENCH/.." && pwd)
TARN_SRC=${TARN:-$REPO/target/release/tarn}
DURATION=${DURATION:-600}
VOL_SIZE=${VOL_SIZE:-56G}
TARGETS=${TARGETS:-tarn qemu}
ROUNDS=${ROUNDS:-1}
SAMPLE=${SAMPLE:-5}
FLUSH_EVERY=${FLUSH_EVERY:-256}
QD=${QD:-32}
IOLOG_RATE=${IOLOG_RATE:-80000}
QEMU_PREALLOC=${QEMU_PREALLOC:-full}
DIR=${BENCH_DIR:-/var/tmp/tarn-aging}
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
OUT=${OUT:-$BENCH/results/raw/$STAMP-aging}
RESULT=${RESULT:-$BENCH/results/$STAMP-aging.txt}
SYSPY=/usr/bin/python3
export LC_ALL=C

bytes() { "$SYSPY" -c 'import sys;s=sys.argv[1];m={"K":1<<10,"M":1<<20,"G":1<<30,"T":1<<40};print(int(s[:-1])*m[s[-1].upper()] if s[-1].upper() in m else int(s))' "$1"; }
VOL_B=$(bytes "$VOL_SIZE")
POOL_B=$(bytes "${POOL_SIZE:-$((VOL_B * 2))}")

for c in fio qemu-img qemu-nbd nbdinfo; do
  command -v $c >/dev/null || { echo "aging: $c missing, run: bash scripts/deps.sh" >&2; exit 1; }
done
need_plots aging
mkdir -p "$DIR" "$OUT"
# a directory of our own: a concurrent run with the same BENCH_DIR must not
# clean up our pool (it did once: the pool was unlinked under a running server)
DIR=$(mktemp -d "$DIR/run.XXXX")
TARN=$DIR/tarn.bin
if [[ " $TARGETS " == *" tarn "* ]]; then
  [ -x "$TARN_SRC" ] || { echo "aging: $TARN_SRC not built (cargo build --release -p tarn-cli)" >&2; exit 1; }
  cp "$TARN_SRC" "$TARN"
  TARN_DATE=$(date -r "$TARN_SRC" '+%F %T')
fi
avail=$(df -B1 --output=avail "$DIR" | tail -1)
need=$((VOL_B + DURATION * IOLOG_RATE * 28 + (2 << 30)))
if [ "$avail" -lt "$need" ]; then
  echo "aging: $DIR has $((avail >> 30)) GiB free, the run may need $((need >> 30)) GiB (VOL_SIZE=$VOL_SIZE)" >&2
  exit 1
fi

PIDS=()
SRV_PID=
MON_PID=
cleanup() {
  set +e
  [ -n "$MON_PID" ] && kill "$MON_PID" 2>/dev/null
  stop_pids 120 "${PIDS[@]}"
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
load1() { cut -d' ' -f1 /proc/loadavg; }
us_now() { local t=$EPOCHREALTIME; echo "${t/./}"; }
free_port() { "$SYSPY" -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
fact() { # KEY VALUE: one line of the target's facts file
  printf '%s\t%s\t%s\n' "$1" "$2" "$(load1)" >>"$FACTS"
}
wait_nbd() { # URI PID POLL_SECONDS: 0 once the server answers NBD
  local end=$((SECONDS + 600))
  while [ $SECONDS -lt $end ]; do
    kill -0 "$2" 2>/dev/null || return 1
    timeout 5 nbdinfo --size "$1" >/dev/null 2>&1 && return 0
    sleep "$3"
  done
  return 1
}
timed() { # KEY CMD...: wall time of CMD in ms into the facts file; its stdout into $TGT_DIR/KEY.out
  local key=$1 t0 t1 rc=0; shift
  t0=$(us_now)
  "$@" >"$TGT_DIR/$key.out" 2>>"$TGT_DIR/cmd.log" || rc=$?
  t1=$(us_now)
  fact "$key ms" "$(((t1 - t0) / 1000)).$(printf '%03d' $(((t1 - t0) % 1000)))"
  [ $rc -eq 0 ] || fact "$key exit" "$rc"
}
monitor() { # PID FILE: VmRSS / VmHWM every SAMPLE seconds while PID lives
  local t0 now rss hwm
  t0=$(us_now)
  printf 't_s\tvmrss_kb\tvmhwm_kb\tload1\n' >"$2"
  while kill -0 "$1" 2>/dev/null; do
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null) || break
    hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null) || break
    now=$(us_now)
    printf '%s\t%s\t%s\t%s\n' "$(((now - t0) / 1000000))" "$rss" "$hwm" "$(load1)" >>"$2"
    sleep "$SAMPLE"
  done
}
start_monitor() { monitor "$SRV_PID" "$1" & MON_PID=$!; }
stop_monitor() { [ -n "$MON_PID" ] && { kill "$MON_PID" 2>/dev/null || true; wait "$MON_PID" 2>/dev/null || true; }; MON_PID=; }
stop_server() { # KEY: SIGTERM -> exit, timed (tarn drains, commits and checkpoints)
  [ -n "$SRV_PID" ] || return 0
  local t0 t1 i
  t0=$(us_now)
  kill -TERM "$SRV_PID" 2>/dev/null || true
  for i in $(seq 1 60000); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.01; done
  kill -0 "$SRV_PID" 2>/dev/null && { log "server $SRV_PID ignored SIGTERM for 10 min, killing"; kill -KILL "$SRV_PID"; fact "$1 killed" 1; }
  wait "$SRV_PID" 2>/dev/null || true
  t1=$(us_now)
  fact "$1 ms" "$(((t1 - t0) / 1000))"
  SRV_PID=
}

# --- servers: start_* set SRV_PID and URI, and record the open time -----------
start_tarn() { # KEY
  local port t0 t1
  port=$(free_port); URI=nbd://127.0.0.1:$port/aging
  t0=$(us_now)
  "$TARN" serve -p "$TGT_DIR/pool.img" --listen "127.0.0.1:$port" >>"$TGT_DIR/serve.log" 2>&1 &
  SRV_PID=$!; PIDS+=("$SRV_PID")
  wait_nbd "$URI" "$SRV_PID" 0.01 || { tail -5 "$TGT_DIR/serve.log" >&2; return 1; }
  t1=$(us_now)
  fact "$1 ms" "$(((t1 - t0) / 1000))"
}
QEMU_AIO=io_uring
start_qemu() { # KEY
  local aio port t0 t1
  for aio in $QEMU_AIO threads; do
    port=$(free_port); URI=nbd://127.0.0.1:$port/aging
    t0=$(us_now)
    qemu-nbd -f qcow2 --cache=writeback --aio=$aio --discard=unmap -t -x aging -b 127.0.0.1 -p "$port" \
      "$TGT_DIR/disk.qcow2" >>"$TGT_DIR/qemu-nbd.log" 2>&1 &
    SRV_PID=$!; PIDS+=("$SRV_PID")
    if wait_nbd "$URI" "$SRV_PID" 0.01; then
      t1=$(us_now); QEMU_AIO=$aio
      fact "$1 ms" "$(((t1 - t0) / 1000))"
      return 0
    fi
    log "qemu-nbd --aio=$aio failed: $(tail -2 "$TGT_DIR/qemu-nbd.log" | tr '\n' ' ')"
    kill "$SRV_PID" 2>/dev/null || true; wait "$SRV_PID" 2>/dev/null || true; SRV_PID=
  done
  return 1
}
setup_tarn() {
  timeout 120 "$TARN" pool create "$TGT_DIR/pool.img" --size "$POOL_B" >"$TGT_DIR/create.log" 2>&1
  timeout 120 "$TARN" vol create aging --size "$VOL_B" -p "$TGT_DIR/pool.img" >>"$TGT_DIR/create.log" 2>&1
  start_tarn "open empty"
}
setup_qemu() {
  local t0
  t0=$(us_now)
  qemu-img create -q -f qcow2 -o "preallocation=$QEMU_PREALLOC" "$TGT_DIR/disk.qcow2" "$VOL_B"
  fact "qemu-img create preallocation=$QEMU_PREALLOC ms" "$((($(us_now) - t0) / 1000))"
  start_qemu "open empty"
}

after_tarn() { # the aged pool: stop, open, commands
  local p=$TGT_DIR/pool.img
  stop_server "stop (SIGTERM to exit)"
  fact "pool file on disk bytes" "$(du -B1 "$p" | cut -f1)"
  drop_caches
  start_tarn "open (start to first NBD answer, cold cache)"
  sleep 2
  fact "VmRSS after open kB" "$(awk '/^VmRSS/ {print $2}' "/proc/$SRV_PID/status")"
  timed "vol list (server)" "$TARN" vol list -p "$p" --json
  timed "pool status (server)" "$TARN" pool status -p "$p" --json
  stop_server "stop again (nothing changed)"
  drop_caches
  timed "vol list (offline, cold cache)" "$TARN" vol list -p "$p" --json
  timed "vol list (offline, warm)" "$TARN" vol list -p "$p" --json
  timed "pool status (offline)" "$TARN" pool status -p "$p" --json
  timed "pool check (offline)" timeout 1800 "$TARN" pool check -p "$p" --json
  "$SYSPY" - "$TGT_DIR" >>"$FACTS" <<'PY' || true
import json, sys
d = sys.argv[1]
try:
    vols = json.load(open(d + "/vol list (server).out"))
    print(f"extents\t{sum(v['extents'] for v in vols)}\t-")
    print(f"allocated bytes\t{sum(v['allocated'] for v in vols)}\t-")
except Exception as e:
    print(f"extents\t? ({e})\t-")
try:
    st = json.load(open(d + "/pool status (server).out"))
    print(f"metadata bytes\t{st['metadata']}\t-")
    print(f"journal bytes\t{st.get('journal_size', '?')}\t-")
    print(f"pool used bytes\t{st['used']}\t-")
    c = st.get("metadata_cache", {})
    print(f"metadata cache bytes\t{c.get('budget', c.get('capacity', 0))}\t-")
    print(f"metadata cache hit rate\t{c.get('hit_rate', 0):.4f}\t-")
except Exception as e:
    print(f"metadata bytes\t? ({e})\t-")
PY
}
after_qemu() {
  local img=$TGT_DIR/disk.qcow2
  stop_server "stop (SIGTERM to exit)"
  fact "pool file on disk bytes" "$(du -B1 "$img" | cut -f1)"
  drop_caches
  start_qemu "open (start to first NBD answer, cold cache)"
  sleep 2
  fact "VmRSS after open kB" "$(awk '/^VmRSS/ {print $2}' "/proc/$SRV_PID/status")"
  stop_server "stop again (nothing changed)"
  drop_caches
  timed "qemu-img info (offline, cold cache)" qemu-img info --output=json "$img"
  timed "qemu-img check (offline)" timeout 1800 qemu-img check "$img"
}

run_target() { # TARGET ROUND
  local tgt=$1 r=$2 tag=$1.r$2 rc=0 l0
  TGT_DIR=$(mktemp -d "$DIR/t.$tag.XXXX")
  FACTS=$OUT/$tag.facts.tsv
  : >"$FACTS"
  if ! "setup_$tgt"; then log "setup of $tgt failed"; rm -rf "$TGT_DIR"; return 0; fi
  drop_caches
  l0=$(load1)
  start_monitor "$OUT/$tag.rss.tsv"
  timeout $((DURATION + 600)) fio --name=aging --ioengine=nbd "--uri=$URI" "--iodepth=$QD" \
    "--read_iolog=$DIR/aging.iolog" --read_iolog_chunked=1 "--runtime=$DURATION" \
    "--write_iops_log=$OUT/$tag" "--write_lat_log=$OUT/$tag" --log_avg_msec=1000 --iopsavgtime=1000 \
    --log_max_value=1 --percentile_list=1:10:25:50:75:90:95:99:99.5:99.9:99.95:99.99:99.999 \
    --output-format=json "--output=$OUT/$tag.json" >"$OUT/$tag.fio.out" 2>&1 || rc=$?
  [ $rc -eq 0 ] || log "fio on $tgt exit $rc: $(tail -2 "$OUT/$tag.fio.out" | tr '\n' ' ')"
  fact "load1 at fio start" "$l0"
  fact "fio exit" "$rc"
  rm -f "$OUT/$tag"_slat.*.log "$OUT/$tag"_lat.*.log
  stop_monitor
  start_monitor "$OUT/$tag.rss-stop.tsv"   # memory while stopping
  "after_$tgt" || log "after-run steps of $tgt failed (see $OUT/cmd.log)"
  stop_monitor
  cp "$TGT_DIR"/*.log "$OUT/" 2>/dev/null || true
  for f in "$TGT_DIR"/*.out; do [ -e "$f" ] && cp "$f" "$OUT/$tag.$(basename "$f" | tr -d '()' | tr ' ' '_')"; done
  rm -rf "$TGT_DIR"
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
log "aging: targets [$TARGETS], ${DURATION}s each, volume $VOL_SIZE, QD$QD, flush every $FLUSH_EVERY, $ROUNDS round(s); raw files in $OUT"
NWRITES=$((DURATION * IOLOG_RATE))
log "iolog: $NWRITES writes"
"$SYSPY" "$BENCH/gen_iolog.py" nbd "$VOL_B" "$NWRITES" "$FLUSH_EVERY" "$DIR/aging.iolog"
read -r -a T_ARR <<<"$TARGETS"
n=${#T_ARR[@]}
for r in $(seq 1 "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    tgt=${T_ARR[$(((r - 1 + k) % n))]}   # alternate the order per round
    log "round $r: $tgt for ${DURATION}s (load $(load1))"
    run_target "$tgt" "$r"
  done
done
rm -f "$DIR/aging.iolog"

{
  echo "tarn aging benchmark $STAMP  ($(uname -r), $(nproc) cpus, $(free -g | awk '/^Mem:/ {print $2}') GiB RAM, fs of $DIR: $(df --output=fstype "$DIR" | tail -1))"
  echo "4K random writes (fio iolog replay, seed 32, norandommap), QD$QD, NBD FLUSH after every $FLUSH_EVERY writes, ${DURATION}s per target, volume $VOL_SIZE (tarn: sparse pool file of $((POOL_B >> 30)) GiB), TCP loopback, $ROUNDS round(s)"
  echo "qemu-nbd: qcow2 (64K clusters, preallocation=$QEMU_PREALLOC, default cache sizes) --cache=writeback --aio=$QEMU_AIO --discard=unmap"
  echo "git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none)$(git -C "$REPO" diff --quiet HEAD -- crates 2>/dev/null || echo ' (+ uncommitted changes in crates/)')  tarn binary: built ${TARN_DATE:-none}  fio: $(fio --version)  $(qemu-img --version | head -1)"
  echo "load at start: $LOAD_START, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  "$SYSPY" "$BENCH/aging_report.py" "$OUT" "$ROUNDS" $TARGETS
} | tee "$RESULT"
plots aging "$OUT" "$ROUNDS" "${RESULT%.txt}" $TARGETS
log "results: $RESULT and its plots ${RESULT%.txt}-*.png (raw files in $OUT)"

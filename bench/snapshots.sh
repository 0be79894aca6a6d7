#!/usr/bin/env bash
# Snapshot benchmark: what snapshots cost tarn, side by side with qcow2
# internal snapshots (qemu-img snapshot -c, with qemu-nbd stopped around it)
# and qcow2 backing chains. Not part of the tests.
#
#   bash bench/snapshots.sh
#
# Sections (BENCH_SECTIONS, all by default):
#   write    4K random write QD32 (fio, nbd engine) on a fully written volume
#            after 0, 1 and 10 snapshots: "pass 1" writes every block once
#            in random order (fio's random map; capped at BENCH_RUNTIME), so
#            with a snapshot every write lands on a shared block (tarn:
#            redirect, qcow2: cluster COW); "steady" is a time-based run after
#            it (norandommap). Ratios against each target's 0-snapshot row.
#   cli      wall time of tarn's CLI against a running server (process start
#            and control socket included): snap create on sequential and 4K-
#            fragmented maps, snap delete against changed data (a fresh
#            volume per row; a guest stand-in writes and FLUSHes every 100 ms
#            meanwhile and its longest stall is recorded), 1,000 snapshots:
#            snap list, server stop/start, offline list.
#   read     4K random read QD32 and 1M sequential read QD8 from the head and
#            from the oldest of 10 snapshots (qemu: qemu-nbd -l), and from a
#            clone at depth 1 and depth BENCH_CLONE_DEPTH (qemu: qcow2 overlay
#            chain of the same depth).
#   example  cargo run --release -p tarn-engine --example snapshot_cost: the
#            engine-level timings (creation at 1 and 64 GiB written, ...).
# Env:
#   BENCH_RUNTIME=20        seconds per measured fio run
#   BENCH_SIZE=2G           volume / image size for write and read
#   BENCH_TARGETS="tarn qemu"
#   BENCH_SNAPS="0 1 10 0f" snapshot counts for the write section; 0f (tarn
#                           only): no snapshot, but the volume filled by 4K
#                           random writes, so its map is as fragmented as
#                           after a redirected pass 1 (a control row)
#   BENCH_REPEAT=1          rounds of the write section (the report shows the
#                           median of the rounds and their spread: on a shared
#                           machine use 3)
#   BENCH_CHURN=1           % of the volume rewritten (4K random, distinct
#                           blocks) between two consecutive snapshots
#   BENCH_CLI_SIZE=1G       volume for the cli section
#   BENCH_CLI_REPS=20       snapshot creations timed per case
#   BENCH_CLI_DELTAS="0 16M 256M 1G"   changed before a timed delete
#   BENCH_MANY=1000         snapshots for the list/open case
#   BENCH_CLONE_DEPTH=8
#   BENCH_READ_CACHE=cold   cold: drop the page cache before each read run (as
#                           run.sh); warm: read the view once first instead
#                           (isolates the map work from the disk)
#   BENCH_EXAMPLE_ARGS=""   extra options for snapshot_cost (see its header)
#   BENCH_DIR=/var/tmp/tarn-bench-snap   scratch (needs ~4x BENCH_SIZE free;
#                           the example needs 72 GiB for its 64 GiB row, or
#                           skips that row and says so)
#   TARN=target/release/tarn (copied into BENCH_DIR at start, so a rebuild
#                           during the run does not change the binary)
# Output: tables on stdout, also in bench/results/<date>-snapshots.txt; raw
# fio JSON and logs in bench/results/raw/<date>-snapshots/ (gitignored).
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
. "$BENCH/common.sh"
REPO=$(cd "$BENCH/.." && pwd)
TARN_SRC=${TARN:-$REPO/target/release/tarn}
RUNTIME=${BENCH_RUNTIME:-20}
SIZE=${BENCH_SIZE:-2G}
TARGETS=${BENCH_TARGETS:-tarn qemu}
SNAPS=${BENCH_SNAPS:-0 1 10 0f}
REPEAT=${BENCH_REPEAT:-1}
CHURN=${BENCH_CHURN:-1}
SECTIONS=${BENCH_SECTIONS:-write cli read example}
CLI_SIZE=${BENCH_CLI_SIZE:-1G}
CLI_REPS=${BENCH_CLI_REPS:-20}
CLI_DELTAS=${BENCH_CLI_DELTAS:-0 16M 256M 1G}
MANY=${BENCH_MANY:-1000}
CLONE_DEPTH=${BENCH_CLONE_DEPTH:-8}
READ_CACHE=${BENCH_READ_CACHE:-cold}
EXAMPLE_ARGS=${BENCH_EXAMPLE_ARGS:-}
DIR=${BENCH_DIR:-/var/tmp/tarn-bench-snap}
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
RAW=$BENCH/results/raw/$STAMP-snapshots
OUT=$BENCH/results/$STAMP-snapshots.txt
SYSPY=/usr/bin/python3
export LC_ALL=C

bytes() { "$SYSPY" -c 'import sys;s=sys.argv[1];m={"K":1<<10,"M":1<<20,"G":1<<30,"T":1<<40};print(int(s[:-1])*m[s[-1].upper()] if s[-1].upper() in m else int(s))' "$1"; }
SIZE_B=$(bytes "$SIZE")
CLI_B=$(bytes "$CLI_SIZE")
has() { [[ " $2 " == *" $1 "* ]]; }

for c in fio qemu-img qemu-nbd nbdinfo; do
  command -v $c >/dev/null || { echo "bench: $c missing, run: bash scripts/deps.sh" >&2; exit 1; }
done
"$SYSPY" -c 'import nbd' 2>/dev/null || { echo "bench: python3-libnbd missing (scripts/deps.sh)" >&2; exit 1; }
mkdir -p "$DIR" "$RAW"
TARN=$DIR/tarn.bin
if [ -x "$TARN_SRC" ] && "$TARN_SRC" snap --help >/dev/null 2>&1; then
  cp "$TARN_SRC" "$TARN"
  TARN_DATE=$(date -r "$TARN_SRC" '+%F %T')
else
  echo "bench: $TARN_SRC missing or without 'snap' (cargo build --release -p tarn-cli): skipping tarn" >&2
  TARGETS=${TARGETS//tarn/}
  SECTIONS=${SECTIONS//cli/}
fi

WRITE=$RAW/write.tsv READ=$RAW/read.tsv CLI=$RAW/cli.tsv
: >"$WRITE"; : >"$READ"; : >"$CLI"
PIDS=()
SRV_PID=
BG_PID=
cleanup() {
  set +e
  stop_pids 30 "${PIDS[@]}"
  rm -rf "$DIR"/t.* "$DIR"/tarn-snapshot-cost-*.img
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
load1() { cut -d' ' -f1 /proc/loadavg; }
free_port() { "$SYSPY" -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_nbd() { # URI PID [poll seconds]
  local end=$((SECONDS + 60))
  while [ $SECONDS -lt $end ]; do
    kill -0 "$2" 2>/dev/null || return 1
    timeout 5 nbdinfo --size "$1" >/dev/null 2>&1 && return 0
    sleep "${3:-0.2}"
  done
  return 1
}
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
us_now() { local t=$EPOCHREALTIME; echo "${t/./}"; }
sample() { # KEY SETUP MICROSECONDS [NOTE]
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(load1)" "${4:-}" >>"$CLI"
}
timed() { # KEY SETUP CMD... : run once, record its wall time
  local key=$1 setup=$2 t0 t1; shift 2
  t0=$(us_now)
  "$@" >>"$TGT_DIR/cmd.log" 2>&1 || { log "failed: $*: $(tail -1 "$TGT_DIR/cmd.log")"; return 1; }
  t1=$(us_now)
  sample "$key" "$setup" $((t1 - t0))
}
stop_server() { # records nothing; SIGTERM, wait up to 60 s
  [ -n "$SRV_PID" ] || return 0
  kill -TERM "$SRV_PID" 2>/dev/null || true
  local i; for i in $(seq 1 3000); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.02; done
  kill -0 "$SRV_PID" 2>/dev/null && { log "server $SRV_PID ignored SIGTERM for 60s, killing"; kill -KILL "$SRV_PID"; }
  wait "$SRV_PID" 2>/dev/null || true
  SRV_PID=
}
teardown() {
  stop_bg
  stop_server
  rm -rf "$TGT_DIR"
}

# --- servers -----------------------------------------------------------------
# Each start sets SRV_PID and BASE (nbd://127.0.0.1:PORT); exports are
# "$BASE/<name>".
start_tarn() { # [poll seconds]
  PORT=$(free_port); BASE=nbd://127.0.0.1:$PORT
  "$TARN" serve -p "$TGT_DIR/pool.img" --listen "127.0.0.1:$PORT" >>"$TGT_DIR/serve.log" 2>&1 &
  SRV_PID=$!; PIDS+=("$SRV_PID")
  wait_nbd "$BASE/bench" "$SRV_PID" "${1:-0.2}" || { tail -5 "$TGT_DIR/serve.log" >&2; return 1; }
}
setup_tarn() { # VOLSIZE_BYTES
  timeout 120 "$TARN" pool create "$TGT_DIR/pool.img" --size $(($1 * 4 + (1 << 30))) >"$TGT_DIR/create.log" 2>&1
  timeout 120 "$TARN" vol create bench --size "$1" -p "$TGT_DIR/pool.img" >>"$TGT_DIR/create.log" 2>&1
  start_tarn
}
QEMU_AIO=io_uring
start_qemu() { # IMAGE [qemu-nbd options...]
  local img=$1 aio; shift
  for aio in $QEMU_AIO native threads; do
    PORT=$(free_port); BASE=nbd://127.0.0.1:$PORT
    qemu-nbd -f qcow2 --cache=none --aio=$aio --discard=unmap -t -x bench -b 127.0.0.1 -p "$PORT" "$@" "$img" \
      >>"$TGT_DIR/qemu-nbd.log" 2>&1 &
    SRV_PID=$!; PIDS+=("$SRV_PID")
    if wait_nbd "$BASE/bench" "$SRV_PID"; then QEMU_AIO=$aio; return 0; fi
    log "qemu-nbd --aio=$aio failed: $(tail -2 "$TGT_DIR/qemu-nbd.log" | tr '\n' ' ')"
    kill "$SRV_PID" 2>/dev/null || true; wait "$SRV_PID" 2>/dev/null || true; SRV_PID=
  done
  return 1
}
setup_qemu() { # VOLSIZE_BYTES
  qemu-img create -q -f qcow2 "$TGT_DIR/disk.qcow2" "$1"
  start_qemu "$TGT_DIR/disk.qcow2"
}
snap_tarn() { # NAME SETUP
  timed "snapshot create" "$2" "$TARN" snap create "bench@$1" -p "$TGT_DIR/pool.img"
}
snap_qemu() { # NAME SETUP: qemu-nbd must be stopped around an internal snapshot
  local t0 t1 t2
  t0=$(us_now); stop_server; t1=$(us_now)
  timed "snapshot create" "$2" qemu-img snapshot -c "$1" "$TGT_DIR/disk.qcow2"
  t2=$(us_now); start_qemu "$TGT_DIR/disk.qcow2"
  sample "server stop + start around it" "$2" $((t1 - t0 + $(us_now) - t2))
}

# --- fio ---------------------------------------------------------------------
fio_run() { # OUT.json URI fio-args... ; "-" on failure
  local js=$1 uri=$2 rc=0; shift 2
  timeout $((RUNTIME * 4 + 600)) fio --name=job --ioengine=nbd "--uri=$uri" --numjobs=1 --group_reporting \
    --randrepeat=0 --output-format=json "--output=$js" "$@" >"${js%.json}.out" 2>&1 || rc=$?
  [ $rc -eq 0 ] || { log "fio $* exit $rc: $(tail -2 "${js%.json}.out" | tr '\n' ' ')"; return 1; }
}
prefill() { # URI SIZE_BYTES TAG [noflush]: write every byte once, then flush (unless noflush)
  fio_run "$RAW/$3.prefill.json" "$1" --rw=write --bs=1M --iodepth=8 "--size=$2" || log "prefill $3 failed"
  [ "${4:-}" = noflush ] || nbd_flush "$1"
}
nbd_flush() { "$SYSPY" -c 'import nbd,sys;h=nbd.NBD();h.connect_uri(sys.argv[1]);h.flush();h.shutdown()' "$1"; }
churn() { # URI SIZE_BYTES BYTES TAG: distinct 4K blocks rewritten in random order
  [ "$3" -gt 0 ] || return 0
  fio_run "$RAW/$4.json" "$1" --rw=randwrite --bs=4k --iodepth=32 "--size=$2" "--io_size=$3" || log "churn $4 failed"
}
start_bg() { # URI SIZE_BYTES: rate-limited random writer in the background
  fio --name=bg --ioengine=nbd "--uri=$1" --rw=randwrite --bs=4k --iodepth=4 --rate_iops=2000 "--size=$2" \
    --time_based --runtime=3600 --norandommap --output=/dev/null >/dev/null 2>&1 &
  BG_PID=$!; PIDS+=("$BG_PID")
  sleep 1
}
stop_bg() {
  [ -n "$BG_PID" ] || return 0
  kill -TERM "$BG_PID" 2>/dev/null || true; wait "$BG_PID" 2>/dev/null || true; BG_PID=
}

# --- write: 4K randwrite after k snapshots -------------------------------------
write_row() { # TARGET K ROUND; K "0f": no snapshot, volume filled by 4K random writes: a map as fragmented as after pass 1)
  local tgt=$1 k=$2 i setup tag=w.$1.$2.$3 l0
  setup="$SIZE written, $k snapshots"
  TGT_DIR=$(mktemp -d "$DIR/t.$tag.XXXX")
  if ! "setup_$tgt" "$SIZE_B"; then log "setup of $tgt failed"; teardown; return 0; fi
  if [ "$k" = 0f ]; then
    fio_run "$RAW/$tag.prefill.json" "$BASE/bench" --rw=randwrite --bs=4k --iodepth=32 "--size=$SIZE_B" || log "prefill failed"
    nbd_flush "$BASE/bench"
  else
    prefill "$BASE/bench" "$SIZE_B" "$tag"
  fi
  for i in $(seq 1 "${k%f}"); do
    [ "$i" -gt 1 ] && churn "$BASE/bench" "$SIZE_B" $((SIZE_B / 4096 * CHURN / 100 * 4096)) "$tag.churn$i"
    "snap_$tgt" "s$i" "$tgt: $setup"
  done
  drop_caches
  l0=$(load1)
  fio_run "$RAW/$tag.pass1.json" "$BASE/bench" --rw=randwrite --bs=4k --iodepth=32 "--size=$SIZE_B" \
    "--runtime=$RUNTIME" || true
  printf '%s\t%s\tpass1\t%s\t%s\t%s\t%s\n' "$tgt" "$k" "$RAW/$tag.pass1.json" "$l0" "$(load1)" "$3" >>"$WRITE"
  l0=$(load1)
  fio_run "$RAW/$tag.steady.json" "$BASE/bench" --rw=randwrite --bs=4k --iodepth=32 "--size=$SIZE_B" \
    --time_based "--runtime=$RUNTIME" --norandommap || true
  printf '%s\t%s\tsteady\t%s\t%s\t%s\t%s\n' "$tgt" "$k" "$RAW/$tag.steady.json" "$l0" "$(load1)" "$3" >>"$WRITE"
  cp "$TGT_DIR"/*.log "$RAW/" 2>/dev/null || true
  teardown
}

# --- read: head vs snapshot vs clone chains ------------------------------------
read_pair() { # TARGET VIEW URI SIZE
  local l0 wl args
  for wl in rr4k sr1m; do
    if [ $wl = rr4k ]; then args=(--rw=randread --bs=4k --iodepth=32 --norandommap)
    else args=(--rw=read --bs=1M --iodepth=8); fi
    if [ "$READ_CACHE" = warm ]; then   # read the whole view once first (tarn's data path is the page cache)
      fio_run "$RAW/r.$1.$2.$wl.warmup.json" "$3" "--size=$4" --rw=read --bs=1M --iodepth=8 || true
    else
      drop_caches
    fi
    l0=$(load1)
    fio_run "$RAW/r.$1.$2.$wl.json" "$3" "--size=$4" --time_based "--runtime=$RUNTIME" "${args[@]}" || true
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$wl" "$RAW/r.$1.$2.$wl.json" "$l0" "$(load1)" >>"$READ"
  done
}
read_target() { # TARGET
  local tgt=$1 i d one=$((SIZE_B / 4096 * CHURN / 100 * 4096))
  TGT_DIR=$(mktemp -d "$DIR/t.r.$tgt.XXXX")
  if ! "setup_$tgt" "$SIZE_B"; then log "setup of $tgt failed"; teardown; return 0; fi
  prefill "$BASE/bench" "$SIZE_B" "r.$tgt"
  for i in $(seq 1 10); do
    "snap_$tgt" "s$i" "$tgt: $SIZE written, read setup"
    churn "$BASE/bench" "$SIZE_B" "$one" "r.$tgt.churn$i"
  done
  read_pair "$tgt" head "$BASE/bench" "$SIZE_B"
  if [ "$tgt" = tarn ]; then
    read_pair tarn snap1of10 "$BASE/bench@s1" "$SIZE_B"
    # c1 = clone of bench@s1, c2 = clone of c1@base, ...; 1% rewritten in each
    local parent=bench psnap=s1
    for d in $(seq 1 "$CLONE_DEPTH"); do
      timed "vol clone" "depth $d" "$TARN" vol clone "$parent@$psnap" "c$d" -p "$TGT_DIR/pool.img"
      churn "$BASE/c$d" "$SIZE_B" "$one" "r.tarn.c$d"
      "$TARN" snap create "c$d@base" -p "$TGT_DIR/pool.img" >>"$TGT_DIR/cmd.log" 2>&1
      parent=c$d psnap=base
    done
    read_pair tarn clone1 "$BASE/c1" "$SIZE_B"
    read_pair tarn "clone$CLONE_DEPTH" "$BASE/c$CLONE_DEPTH" "$SIZE_B"
  else
    stop_server
    start_qemu "$TGT_DIR/disk.qcow2" -r -l snapshot.name=s1
    read_pair qemu snap1of10 "$BASE/bench" "$SIZE_B"
    stop_server
    # overlay chain: ov1 backed by disk.qcow2, ov2 by ov1, ...; 1% rewritten in each
    local prev=$TGT_DIR/disk.qcow2
    for d in $(seq 1 "$CLONE_DEPTH"); do
      qemu-img create -q -f qcow2 -F qcow2 -b "$prev" "$TGT_DIR/ov$d.qcow2"
      start_qemu "$TGT_DIR/ov$d.qcow2"
      churn "$BASE/bench" "$SIZE_B" "$one" "r.qemu.ov$d"
      stop_server
      prev=$TGT_DIR/ov$d.qcow2
    done
    start_qemu "$TGT_DIR/ov1.qcow2" -r
    read_pair qemu clone1 "$BASE/bench" "$SIZE_B"
    stop_server
    start_qemu "$TGT_DIR/ov$CLONE_DEPTH.qcow2" -r
    read_pair qemu "clone$CLONE_DEPTH" "$BASE/bench" "$SIZE_B"
  fi
  cp "$TGT_DIR"/*.log "$RAW/" 2>/dev/null || true
  teardown
}

# --- cli: tarn's admin commands against a running server -----------------------
snap_reps() { # SETUP CHURN N PREFIX: N creations, CHURN 4K writes before each
  "$SYSPY" "$BENCH/snap_loop.py" --prefix "$4" "$BASE/bench" "$CLI_B" "$2" "$3" -- \
    "$TARN" snap create "bench@{name}" -p "$TGT_DIR/pool.img" >"$TGT_DIR/loop.tsv" || { log "snap loop failed"; return 1; }
  local us
  while IFS=$'\t' read -r _ us; do sample "snap create" "$1" "$us"; done <"$TGT_DIR/loop.tsv"
}
cli_section() {
  local d i pool setup
  # sequential map
  TGT_DIR=$(mktemp -d "$DIR/t.cli.XXXX"); pool=$TGT_DIR/pool.img
  setup_tarn "$CLI_B" || { teardown; return 0; }
  prefill "$BASE/bench" "$CLI_B" cli.seq noflush
  timed "snap create right after the fill (unflushed)" "$CLI_SIZE sequential" "$TARN" snap create bench@first -p "$pool"
  "$TARN" snap delete bench@first -p "$pool" >>"$TGT_DIR/cmd.log" 2>&1
  for i in $(seq 1 "$CLI_REPS"); do timed "vol list (CLI round-trip baseline)" "$CLI_SIZE, server" "$TARN" vol list -p "$pool"; done
  snap_reps "$CLI_SIZE sequential, idle" 0 "$CLI_REPS" i
  snap_reps "$CLI_SIZE sequential, 8 4K writes before" 8 "$CLI_REPS" w
  start_bg "$BASE/bench" "$CLI_B"
  snap_reps "$CLI_SIZE sequential, under 2k IOPS" 0 "$CLI_REPS" b
  stop_bg
  for i in $(seq 0 $((CLI_REPS - 1))); do
    timed "snap delete (little changed)" "$CLI_SIZE sequential" "$TARN" snap delete "bench@i$(printf %04d "$i")" -p "$pool"
  done
  teardown
  # deletion against changed data: a fresh volume per row, written sequentially
  # (or, for the largest delta, also as 4K random writes: every freed block is
  # then its own extent); a guest stand-in writes and FLUSHes every 100 ms
  # during the delete, and the longest FLUSH it saw is recorded
  local last; for d in $CLI_DELTAS; do last=$d; done
  for d in $CLI_DELTAS frag:$last; do
    local layout=sequential dd=$d
    [ "${d#frag:}" != "$d" ] && { layout=4K-random; dd=${d#frag:}; }
    local db; db=$(bytes "$dd"); [ "$db" -le "$CLI_B" ] || db=$CLI_B
    TGT_DIR=$(mktemp -d "$DIR/t.cli.XXXX"); pool=$TGT_DIR/pool.img
    setup_tarn "$CLI_B" || { teardown; continue; }
    if [ $layout = sequential ]; then prefill "$BASE/bench" "$CLI_B" "cli.delta.$dd"
    else fio_run "$RAW/cli.delta.frag.fill.json" "$BASE/bench" --rw=randwrite --bs=4k --iodepth=32 "--size=$CLI_B" || true
      nbd_flush "$BASE/bench"; fi
    local reps=1; [ "$db" -le $((16 << 20)) ] && reps=5
    for i in $(seq 1 $reps); do
      "$TARN" snap create bench@old -p "$pool" >>"$TGT_DIR/cmd.log" 2>&1
      churn "$BASE/bench" "$CLI_B" "$db" "cli.delta.$dd.$i"
      "$TARN" snap create bench@new -p "$pool" >>"$TGT_DIR/cmd.log" 2>&1
      "$SYSPY" "$BENCH/flush_probe.py" "$BASE/bench" 600 0.1 >"$TGT_DIR/probe.out" 2>"$TGT_DIR/probe.err" &
      local probe=$!; PIDS+=("$probe")
      for _ in $(seq 1 100); do grep -q ready "$TGT_DIR/probe.err" 2>/dev/null && break; sleep 0.05; done
      sleep 0.3
      timed "snap delete, changed since:" "$dd (4K random), $CLI_SIZE $layout" "$TARN" snap delete bench@old -p "$pool"
      kill -TERM "$probe" 2>/dev/null; wait "$probe" 2>/dev/null || true
      sample "  guest FLUSH during it (longest)" "$dd, $CLI_SIZE $layout" "$(cut -f1 "$TGT_DIR/probe.out" 2>/dev/null || echo 0)" \
        "4K write + flush every 100 ms"
      sample "  guest 4K WRITE during it (longest)" "$dd, $CLI_SIZE $layout" "$(cut -f2 "$TGT_DIR/probe.out" 2>/dev/null || echo 0)" \
        "(a hole punch holds the pool file's inode lock)"
      timed "  then delete the next (0 changed)" "$CLI_SIZE $layout" "$TARN" snap delete bench@new -p "$pool"
    done
    teardown
  done
  # fragmented map: every 4K block written once in random order
  TGT_DIR=$(mktemp -d "$DIR/t.cli.XXXX"); pool=$TGT_DIR/pool.img
  setup_tarn "$CLI_B" || { teardown; return 0; }
  fio_run "$RAW/cli.frag.fill.json" "$BASE/bench" --rw=randwrite --bs=4k --iodepth=32 "--size=$CLI_B" || log "frag fill failed"
  nbd_flush "$BASE/bench"
  "$TARN" vol list -p "$pool" >"$RAW/cli.frag.vol-list.txt" 2>&1 || true
  snap_reps "$CLI_SIZE 4K-random (frag.), 8 writes bef." 8 "$CLI_REPS" f
  teardown
  # many snapshots
  TGT_DIR=$(mktemp -d "$DIR/t.cli.XXXX"); pool=$TGT_DIR/pool.img
  setup_tarn "$CLI_B" || { teardown; return 0; }
  prefill "$BASE/bench" "$CLI_B" cli.many
  setup="$CLI_SIZE vol, 0 snapshots"
  server_restart "$setup"
  timed "snap list (server)" "$setup" "$TARN" snap list bench -p "$pool"
  log "cli: $MANY snapshots, 64 random 4K writes before each"
  "$SYSPY" "$BENCH/snap_loop.py" --prefix m "$BASE/bench" "$CLI_B" 64 "$MANY" -- \
    "$TARN" snap create "bench@{name}" -p "$pool" >"$TGT_DIR/loop.tsv" || log "many loop failed"
  local n; n=$(wc -l <"$TGT_DIR/loop.tsv"); local tenth=$(((n + 9) / 10))
  head -n "$tenth" "$TGT_DIR/loop.tsv" | while IFS=$'\t' read -r _ us; do sample "snap create, first 10%" "0..$tenth snapshots exist" "$us"; done
  tail -n "$tenth" "$TGT_DIR/loop.tsv" | while IFS=$'\t' read -r _ us; do sample "snap create, last 10%" "$((n - tenth))..$n snapshots exist" "$us"; done
  setup="$CLI_SIZE vol, $n snapshots"
  for i in 1 2 3 4 5; do timed "snap list (server)" "$setup" "$TARN" snap list bench -p "$pool"; done
  for i in 1 2 3 4 5; do timed "snap list --json (server)" "$setup" "$TARN" snap list bench --json -p "$pool"; done
  "$TARN" snap list bench -p "$pool" >"$RAW/cli.many.snap-list.txt" 2>&1 || true
  server_restart "$setup"
  stop_server
  for i in 1 2 3; do timed "snap list (offline: open + list)" "$setup" "$TARN" snap list bench -p "$pool"; done
  for i in 1 2 3; do timed "pool status (offline: open)" "$setup" "$TARN" pool status -p "$pool"; done
  teardown
}
server_restart() { # SETUP: time SIGTERM -> exit (close), and start -> NBD answers
  local t0 t1
  t0=$(us_now); stop_server; t1=$(us_now)
  sample "server stop (SIGTERM: drain, checkpoint, exit)" "$1" $((t1 - t0))
  t0=$(us_now); start_tarn 0.01; t1=$(us_now)
  sample "server start to first NBD answer" "$1" $((t1 - t0)) "polled every 10 ms"
}

# What one hole punch (tarn's discard of freed space in a pool file) costs on
# this filesystem: 256 scattered 4K punches in a 256 MiB file.
punch_probe() {
  "$SYSPY" - "$DIR/punch.raw" <<'PY' 2>/dev/null || echo "punch probe failed"
import ctypes, os, random, sys, time
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
f = sys.argv[1]
with open(f, "wb") as fh:
    buf = os.urandom(1 << 20)
    for _ in range(256):
        fh.write(buf)
    fh.flush(); os.fsync(fh.fileno())
fd = os.open(f, os.O_RDWR)
blocks = sorted(random.Random(1).sample(range(65536), 256))
t = time.perf_counter()
for b in blocks:
    libc.fallocate(fd, 3, b * 4096, 4096)  # PUNCH_HOLE | KEEP_SIZE
d = time.perf_counter() - t
t = time.perf_counter()
libc.fallocate(fd, 3, 32 << 20, 64 << 20)
d2 = time.perf_counter() - t
os.close(fd); os.unlink(f)
print(f"{d / 256 * 1e6:.0f} us per scattered 4K punch-hole, {d2 * 1e3:.1f} ms for one 64 MiB punch")
PY
}
PUNCH_START=$(punch_probe)
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
log "bench: sections [$SECTIONS], targets [$TARGETS], snaps [$SNAPS], size $SIZE, runtime ${RUNTIME}s"
if has write "$SECTIONS"; then
  read -r -a T_ARR <<<"$TARGETS"
  j=0
  for rep in $(seq 1 "$REPEAT"); do
    for k in $SNAPS; do
      n=${#T_ARR[@]}
      for q in $(seq 0 $((n - 1))); do
        tgt=${T_ARR[$(((j + q) % n))]}   # rotate the order per row
        [ "$k" = 0f ] && [ "$tgt" != tarn ] && continue
        log "write: $tgt after $k snapshots (round $rep of $REPEAT)"
        write_row "$tgt" "$k" "$rep"
      done
      j=$((j + 1))
    done
  done
fi
if has cli "$SECTIONS"; then
  log "cli timings"
  cli_section
fi
if has read "$SECTIONS"; then
  for tgt in $TARGETS; do
    log "read: $tgt"
    read_target "$tgt"
  done
fi
EXAMPLE_OUT=$RAW/snapshot_cost.txt
: >"$EXAMPLE_OUT"
if has example "$SECTIONS"; then
  log "engine example (cargo run --release -p tarn-engine --example snapshot_cost)"
  mkdir -p "$DIR/example"
  # shellcheck disable=SC2086
  (cd "$REPO" && cargo run -q --release -p tarn-engine --example snapshot_cost -- "$DIR/example" $EXAMPLE_ARGS) \
    >"$EXAMPLE_OUT" 2>"$RAW/snapshot_cost.err" || log "snapshot_cost failed: $(tail -3 "$RAW/snapshot_cost.err")"
  rm -rf "$DIR/example"
fi

{
  echo "tarn snapshot benchmark $STAMP  ($(uname -r), $(nproc) cpus, $(free -g | awk '/^Mem:/ {print $2}') GiB RAM, fs of $DIR: $(df --output=fstype "$DIR" | tail -1) ($(awk -v d="$(df --output=target "$DIR" | tail -1)" '$2 == d {print $4}' /proc/mounts | head -1)))"
  echo "sections [$SECTIONS]; size $SIZE, runtime ${RUNTIME}s per fio run, QD32 4K / QD8 1M, numjobs=1, TCP loopback; churn ${CHURN}% between snapshots; reads: $READ_CACHE page cache"
  echo "qemu-nbd: qcow2 (64K clusters) --cache=none --aio=$QEMU_AIO --discard=unmap; internal snapshots with qemu-img snapshot -c, qemu-nbd stopped around it"
  echo "git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none)$(git -C "$REPO" diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')  tarn binary: built ${TARN_DATE:-none}  fio: $(fio --version)  $(qemu-img --version | head -1)"
  echo "load at start: $LOAD_START, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "discard cost of this fs (fallocate PUNCH_HOLE, what tarn does for freed space): at start $PUNCH_START; at end $(punch_probe)"
  echo
  "$SYSPY" "$BENCH/snap_report.py" "$WRITE" "$READ" "$CLI" "$SIZE_B"
  if [ -s "$EXAMPLE_OUT" ]; then
    echo
    echo "== engine level: cargo run --release -p tarn-engine --example snapshot_cost -- $DIR/example $EXAMPLE_ARGS"
    cat "$EXAMPLE_OUT"
  fi
} | tee "$OUT"
log "results: $OUT (raw fio json and logs in $RAW)"

#!/usr/bin/env bash
# tarn on RADOS against RBD through qemu's rbd driver (qemu-nbd, Debian
# qemu-block-extra), on the same throwaway single-node cluster
# (scripts/ceph.sh: one mon, one OSD on bluestore over a sparse file,
# replication 1; STORE=memstore for the RAM store). Both are driven by
# fio's nbd engine over TCP; rounds alternate tarn, rbd, tarn, rbd.
# Not part of the tests.
#   bash bench/rados.sh                  # RUNTIME=15 s per job, ROUNDS=2
# Jobs, in this order on a fresh volume: 4K random write QD32 (first
# writes), 1M sequential write and read QD4, 4K random read QD32, 4K
# random write QD32 (overwrites), then 10 snapshots and the same random
# writes again (what snapshots cost: after / before); snapshot create time (the
# 10 snapshots: `tarn snap create` through the server, `rbd snap create`);
# RADOS operations per client write (the OSD's `op` counter over the fresh
# random-write job, divided by fio's writes). Then, once per target, the
# snapshot create time (median of 5) with 1 GiB and with BIG (16G) written
# sequentially to a fresh volume; BIG=0 leaves that part out.
# Prints one line per job and round, then the medians and tarn/rbd ratios.
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$BENCH/.." && pwd)
. "$BENCH/common.sh"
TARN=${TARN:-$REPO/target/release/tarn}
RUNTIME=${RUNTIME:-15}
ROUNDS=${ROUNDS:-2}
SIZE=${SIZE:-2G}
BIG=${BIG:-16G}
STORE=${STORE:-bluestore}
for t in qemu-nbd fio rbd rados jq; do command -v $t >/dev/null || { echo "rados.sh: $t missing (bash scripts/deps.sh; qemu-block-extra for qemu's rbd driver)" >&2; exit 1; }; done
[ -e /usr/lib/x86_64-linux-gnu/qemu/block-rbd.so ] || { echo "rados.sh: qemu's rbd driver missing (apt-get install qemu-block-extra)" >&2; exit 1; }
[ -x "$TARN" ] || { echo "rados.sh: $TARN missing (cargo build --release -p tarn-cli)" >&2; exit 1; }

W=$(mktemp -d /var/tmp/tarn-bench-rados.XXXXXX)
PIDS=()
cleanup() {
  stop_pids 30 "${PIDS[@]}"
  bash "$REPO/scripts/ceph.sh" stop "$W/ceph" >/dev/null 2>&1 || true
  rm -rf "$W"
}
trap cleanup EXIT
if [ "$STORE" = memstore ]; then
  CONF=$(CEPH_MEMSTORE_BYTES=$((8 << 30)) bash "$REPO/scripts/ceph.sh" start "$W/ceph" tarn)
else
  # the 16 GiB phase runs one target at a time and deletes its data after
  CONF=$(CEPH_BLUESTORE_BYTES=$((26 << 30)) bash "$REPO/scripts/ceph.sh" start "$W/ceph" tarn)
fi
export CEPH_CONF=$CONF
# operations the OSD has executed so far (reads, writes and both)
osd_ops() { ceph daemon "$W/ceph/run/osd.0.asok" perf dump | jq '.osd.op'; }
port() { /usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_nbd() { for _ in $(seq 1 300); do nbdinfo --list "nbd://127.0.0.1:$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "no NBD server on $1" >&2; exit 1; }
ms() { local ns; ns=$(date +%s%N); echo $((ns / 1000000)); }

# fio_run URI RW BS QD -> prints IOPS (random) or MiB/s (sequential)
fio_run() {
  local out=$W/fio.json
  timeout $((RUNTIME + 60)) fio --name=j --ioengine=nbd --uri="$1" --rw="$2" --bs="$3" --iodepth="$4" --size=1G \
    --time_based --runtime="$RUNTIME" --randrepeat=0 --output-format=json --output="$out" >/dev/null 2>"$W/fio.err" ||
    { echo stalled; return 0; }
  cp "$out" "$W/last.json"
  case $2 in
    randwrite) jq '.jobs[0].write.iops | floor' "$out" ;;
    randread) jq '.jobs[0].read.iops | floor' "$out" ;;
    write) jq '.jobs[0].write.bw_bytes / 1048576 | floor' "$out" ;;
    read) jq '.jobs[0].read.bw_bytes / 1048576 | floor' "$out" ;;
  esac
}

# randwrite_ops "TARGET ROUND" URI NAME: 4K random write QD32, its IOPS
# and the RADOS operations the OSD ran per client write meanwhile
randwrite_ops() {
  local ops0 iops
  ops0=$(osd_ops)
  iops=$(fio_run "$2" randwrite 4k 32)
  echo "$1 $3_iops $iops"
  [ "$iops" = stalled ] ||
    echo "$1 $3_ops_per_write $(jq --argjson d $(($(osd_ops) - ops0)) '$d / .jobs[0].write.total_ios * 1000 | floor / 1000' "$W/last.json")"
}

# one round on TARGET (tarn|rbd), a fresh volume/image each round
round() {
  local target=$1 r=$2 p uri snap_ms=0 t0 i
  p=$(port)
  if [ "$target" = tarn ]; then
    "$TARN" pool create "rados://tarn/b$r" --size 16G >/dev/null
    "$TARN" vol create v --size "$SIZE" -p "rados://tarn/b$r" >/dev/null
    "$TARN" serve -p "rados://tarn/b$r" --listen "127.0.0.1:$p" >"$W/serve-$r.log" 2>&1 &
  else
    # layering only: with exclusive-lock, `rbd snap create` must take the
    # lock from qemu-nbd's librbd, and the writes after it stalled here
    rbd create "tarn/img$r" --size "$SIZE" --image-feature layering
    qemu-nbd --cache=none -b 127.0.0.1 -p "$p" -x v --persistent \
      --image-opts "driver=rbd,pool=tarn,image=img$r,conf=$CONF" >"$W/qemu-nbd-$r.log" 2>&1 &
  fi
  PIDS+=($!); local pid=$!
  wait_nbd "$p"
  uri="nbd://127.0.0.1:$p/v"
  # the first job meets a fresh volume: random first writes
  randwrite_ops "$target $r" "$uri" randwrite
  echo "$target $r seqwrite_mib_s $(fio_run "$uri" write 1M 4)"
  echo "$target $r seqread_mib_s $(fio_run "$uri" read 1M 4)"
  echo "$target $r randread_iops $(fio_run "$uri" randread 4k 32)"
  # the same overwrites as after the snapshots, without them: the baseline
  # that shows what the snapshots cost
  randwrite_ops "$target $r" "$uri" randwrite_before_snaps
  for i in $(seq 1 10); do
    t0=$(ms)
    if [ "$target" = tarn ]; then "$TARN" snap create "v@s$i" -p "rados://tarn/b$r" >/dev/null
    else rbd snap create --no-progress "tarn/img$r@s$i" >/dev/null; fi
    snap_ms=$((snap_ms + $(ms) - t0))
  done
  echo "$target $r snap_create_ms $((snap_ms / 10))"
  randwrite_ops "$target $r" "$uri" randwrite_10snaps
  stop_pids 30 "$pid"
}

# timed_snaps TARGET NAME_PREFIX -> median ms of 5 snapshot creations
timed_snaps() {
  local target=$1 pre=$2 i t0 all=()
  for i in 1 2 3 4 5; do
    t0=$(ms)
    if [ "$target" = tarn ]; then "$TARN" snap create "v@$pre$i" -p rados://tarn/big >/dev/null
    else rbd snap create --no-progress "tarn/big@$pre$i" >/dev/null; fi
    all+=($(($(ms) - t0)))
  done
  printf '%s\n' "${all[@]}" | sort -n | sed -n 3p
}

# snapshot creation with 1 GiB and then BIG written, one target at a time;
# the data is deleted after, so the OSD's file holds one target's at most
snap_size() {
  local target=$1 p pid uri
  p=$(port)
  if [ "$target" = tarn ]; then
    # room for the metadata beside BIG of data
    "$TARN" pool create rados://tarn/big --size $(($(numfmt --from=iec "$BIG") + (2 << 30))) >/dev/null
    "$TARN" vol create v --size "$BIG" -p rados://tarn/big >/dev/null
    "$TARN" serve -p rados://tarn/big --listen "127.0.0.1:$p" >"$W/serve-big.log" 2>&1 &
  else
    rbd create tarn/big --size "$BIG" --image-feature layering
    qemu-nbd --cache=none -b 127.0.0.1 -p "$p" -x v --persistent \
      --image-opts "driver=rbd,pool=tarn,image=big,conf=$CONF" >"$W/qemu-nbd-big.log" 2>&1 &
  fi
  pid=$!; PIDS+=($pid)
  wait_nbd "$p"
  uri="nbd://127.0.0.1:$p/v"
  fio --name=j --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=4 --size=1G >/dev/null
  echo "$target 1 snap_create_1g_ms $(timed_snaps "$target" a)"
  fio --name=j --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=4 --offset=1G --size=$(($(numfmt --from=iec "$BIG") - (1 << 30))) >/dev/null
  echo "$target 1 snap_create_${BIG,,}_ms $(timed_snaps "$target" b)"
  stop_pids 60 "$pid"
  if [ "$target" = tarn ]; then rados -p tarn ls | grep '^big\.' | xargs -r -n 64 rados -p tarn rm
  else rbd snap purge --no-progress tarn/big && rbd rm --no-progress tarn/big; fi
}

{
  for r in $(seq 1 "$ROUNDS"); do round tarn "$r"; round rbd "$r"; done
  if [ "$BIG" != 0 ]; then snap_size tarn; snap_size rbd; fi
} | grep -E '^(tarn|rbd) ' | tee "$W/results.txt"
/usr/bin/python3 - "$W/results.txt" <<'PY'
import statistics, sys
v = {}
for line in open(sys.argv[1]):
    t, _, k, x = (line.split() + [""])[:4]
    if x.replace(".", "", 1).isdigit():  # "stalled": fio failed or hung
        v.setdefault(k, {}).setdefault(t, []).append(float(x))
print(f"{'metric':26} {'tarn':>10} {'rbd':>10} {'tarn/rbd':>9}")
for k, d in v.items():
    a, b = (statistics.median(d[t]) if d.get(t) else 0 for t in ("tarn", "rbd"))
    fmt = (lambda x: f"{x:10.3f}") if max(a, b) < 100 else (lambda x: f"{x:10.0f}")
    print(f"{k:26} {fmt(a)} {fmt(b)} {a / b if b else 0:9.2f}")
PY

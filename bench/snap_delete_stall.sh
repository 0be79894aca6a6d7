#!/usr/bin/env bash
# What a snapshot deletion costs the other writers of the pool, on a cold
# pool file. Per round and binary: a 4 GiB volume written sequentially (1M
# writes: whole 64 KiB checksum groups), a snapshot, 10,000 4 KiB random
# overwrites (copied on write: each leaves one block of a group in the
# snapshot's dead list), the pool file evicted from the page cache (that
# file only); then, while a writer on a second volume writes 4 KiB at QD1
# with an fsync after each write, `snap delete` and a flush. Reported: the
# delete + flush wall time, the writer's IOPS over its 8 s, its worst and
# p99.9 latency, and the groups split. Binaries alternate per round.
# CASE=overwrite: no snapshot; the server is restarted after the fills (its
# closing checkpoint closes every overwrite region, so an overwrite there
# goes to new space and frees one block of a coarse group), the pool file
# evicted, and the second volume's writer runs while the OVERWRITES 4 KiB
# random overwrites (QD32) and a flush run on the first volume.
#
#   bash bench/snap_delete_stall.sh
# Env: TARN=target/release/tarn  TARN_B=/path/to/another/tarn (optional)
#      ROUNDS=2  OVERWRITES=10000  DIR=/var/tmp/tarn-snapdel  CASE=delete
# Output: bench/results/<date>-snapdel.txt
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
ROUNDS=${ROUNDS:-2}
OVERWRITES=${OVERWRITES:-10000}
CASE=${CASE:-delete}
DIR=${DIR:-/var/tmp/tarn-snapdel}
OUT="$REPO/bench/results/$(date -u +%Y-%m-%d-%H%M%S)-snapdel.txt"
. "$REPO/bench/common.sh"
need_tools snap_delete_stall fio nbdinfo qemu-io python3
mkdir -p "$DIR" "$REPO/bench/results"
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

serve() { # serve BIN DIR PORT: start the server, print its pid once it answers
  "$1" serve -p "$2/pool.img" --listen "127.0.0.1:$3" >>"$2/serve.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 100); do nbdinfo --size "nbd://127.0.0.1:$3/w" >/dev/null 2>&1 && break; sleep 0.1; done
  echo "$pid"
}
stop() { # stop PID: SIGTERM (the server commits and closes), wait until gone
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 600); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  echo "snap_delete_stall: server $1 did not stop" >&2; return 1
}
overwrite() { # overwrite URI: OVERWRITES 4 KiB random writes, QD32, then fsync
  fio --name=cow --ioengine=nbd --uri="$1" --rw=randwrite --bs=4k --iodepth=32 --size=4G \
    --number_ios="$OVERWRITES" --norandommap --end_fsync=1
}

one() { # one NAME BIN: a line of figures
  local name=$1 bin=$2 d p sp fp s e
  d=$(mktemp -d "$DIR/r.XXXX"); p=$(port)
  "$bin" pool create "$d/pool.img" --size 10G >/dev/null
  "$bin" vol create v --size 4G -p "$d/pool.img" >/dev/null
  "$bin" vol create w --size 1G -p "$d/pool.img" >/dev/null
  sp=$(serve "$bin" "$d" "$p")
  local u="nbd://127.0.0.1:$p"
  fio --name=fill --ioengine=nbd --uri="$u/v" --rw=write --bs=1M --iodepth=8 --size=4G >/dev/null
  fio --name=fill --ioengine=nbd --uri="$u/w" --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null
  if [ "$CASE" = overwrite ]; then
    stop "$sp"
    sp=$(serve "$bin" "$d" "$p")
  else
    "$bin" snap create v@s -p "$d/pool.img" >/dev/null
    overwrite "$u/v" >/dev/null
    sleep 6 # the timed commit after the overwrites
  fi
  python3 -c "import os,sys;fd=os.open(sys.argv[1],os.O_RDONLY);os.fsync(fd);os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)" "$d/pool.img"
  fio --name=lat --ioengine=nbd --uri="$u/w" --rw=randwrite --bs=4k --iodepth=1 --size=1G \
    --time_based --runtime=8 --fsync=1 --output-format=json >"$d/lat.json" 2>&1 &
  fp=$!
  sleep 2
  s=$(date +%s.%N)
  if [ "$CASE" = overwrite ]; then overwrite "$u/v" >/dev/null
  else "$bin" snap delete v@s -p "$d/pool.img" >/dev/null; fi
  qemu-io -f raw "$u/w" -c flush >/dev/null
  e=$(date +%s.%N)
  wait "$fp"
  local split
  split=$("$bin" pool status -p "$d/pool.img" --json | python3 -c 'import json,sys;print(json.load(sys.stdin)["split_groups"])')
  stop "$sp"
  python3 - "$name" "$s" "$e" "$d/lat.json" "$split" "$CASE" <<'PY'
import json, sys
name, s, e, path, split, case = sys.argv[1:7]
t = open(path).read()
w = json.loads(t[t.index('{'):])['jobs'][0]['write']
print(f"{name:7} {case}+flush {float(e)-float(s):6.2f} s  writer {w['iops']:6.0f} IOPS  "
      f"max {w['lat_ns']['max']/1e6:8.1f} ms  p99.9 {w['clat_ns']['percentile'].get('99.900000', 0)/1e6:8.1f} ms  "
      f"groups split {split}  load {open('/proc/loadavg').read().split()[0]}")
PY
  rm -rf "$d"
}

{
  echo "# snap_delete_stall $(date -u +%F' '%T) git $(git -C "$REPO" rev-parse --short HEAD); CASE=$CASE ROUNDS=$ROUNDS OVERWRITES=$OVERWRITES"
  echo "# TARN=$TARN TARN_B=${TARN_B:-}"
  for r in $(seq 1 "$ROUNDS"); do
    if [ -n "${TARN_B:-}" ] && [ $((r % 2)) = 0 ]; then one tarn_b "$TARN_B"; one tarn "$TARN"
    else one tarn "$TARN"; [ -n "${TARN_B:-}" ] && one tarn_b "$TARN_B"; fi
  done
} | tee "$OUT"
echo "snap_delete_stall: $OUT"

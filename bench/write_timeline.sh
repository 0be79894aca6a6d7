#!/usr/bin/env bash
# The 1M sequential overwrite over NBD as a timeline: fio's bandwidth per
# 250 ms, so stalls (a commit's writeback, the first writeback of freshly
# allocated blocks) show where a 4 s average hides them. Each target in
# turn: a fresh server, a 2 GiB prefill (1M sequential, QD8), a pause,
# then the overwrite for WT_SECS. Not part of the tests.
#
#   bash bench/write_timeline.sh
# Env: WT_TARGETS="tarn nbdkit"  TARN=target/release/tarn
#      WT_TARN_SERVE="--commit-interval 60" (extra words for `serve`)
#      WT_SECS=12  WT_PAUSE=6 (seconds between the prefill and the run)
#      WT_DIR=/var/tmp/tarn-wt
# Prints per target the run's MiB/s, server CPU per request, latency p99
# and max, then the bandwidth series (MiB/s per 250 ms); the same goes to
# bench/results/<date>-timeline.txt.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
SECS=${WT_SECS:-12}
DIR=${WT_DIR:-/var/tmp/tarn-wt}
. "$REPO/bench/common.sh"
need_tools write_timeline fio nbdkit nbdinfo python3
work_dir "$DIR" timeline
SRV=
cleanup() {
  set +e
  [ -n "$SRV" ] && kill -TERM "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

start() { # start TARGET: SRV and URI set
  local p
  p=$(port)
  rm -rf "$W/srv" && mkdir -p "$W/srv"
  case $1 in
    tarn)
      "$TARN" pool create "$W/srv/pool.img" --size 4G >/dev/null
      "$TARN" vol create bench --size 2G -p "$W/srv/pool.img" >/dev/null
      # shellcheck disable=SC2086 # the extra options: words on purpose
      "$TARN" serve -p "$W/srv/pool.img" --listen "127.0.0.1:$p" ${WT_TARN_SERVE:-} >"$W/srv/log" 2>&1 &
      SRV=$!; URI="nbd://127.0.0.1:$p/bench" ;;
    nbdkit)
      truncate -s 2G "$W/srv/disk.raw"
      nbdkit -f --exit-with-parent -i 127.0.0.1 -p "$p" file "$W/srv/disk.raw" >"$W/srv/log" 2>&1 &
      SRV=$!; URI="nbd://127.0.0.1:$p/" ;;
    *) echo "write_timeline: unknown target $1" >&2; exit 2 ;;
  esac
  local i
  for i in $(seq 1 150); do
    nbdinfo --size "$URI" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "write_timeline: $1 did not start" >&2; cat "$W/srv/log" >&2; exit 1
}

cpu() { awk '{print $14 + $15}' "/proc/$SRV/stat"; }

timeline() { # timeline TARGET: one line of figures, one of bandwidth
  start "$1"
  fio --name=prefill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 --size=2G \
    --output=/dev/null >/dev/null 2>&1
  sleep "${WT_PAUSE:-6}"
  local c0 c1
  c0=$(cpu)
  fio --name=sw1m --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 --size=2G --time_based \
    --runtime="$SECS" --write_bw_log="$W/bw" --log_avg_msec=250 --output-format=json --output="$W/o.json" \
    >/dev/null 2>&1
  c1=$(cpu)
  kill -TERM "$SRV"; wait "$SRV" 2>/dev/null || true; SRV=
  python3 - "$W/o.json" "$((c1 - c0))" "$(getconf CLK_TCK)" "$1" <<'EOF'
import json, sys
w = json.load(open(sys.argv[1]))["jobs"][0]["write"]
n, p = max(w["total_ios"], 1), w["clat_ns"]["percentile"]
us = int(sys.argv[2]) * 1e6 / int(sys.argv[3]) / n
print(f'{sys.argv[4]}: {w["bw"] / 1024:.0f} MiB/s, server CPU {us:.0f} us/request, '
      f'latency p99 {p["99.000000"] / 1e3:.0f} us, max {w["clat_ns"]["max"] / 1e3:.0f} us')
EOF
  echo "  MiB/s per 250 ms: $(awk -F, '{printf "%d ", $2 / 1024}' "$W"/bw_bw.*.log)"
  rm -f "$W"/bw_bw.*.log
}

{
  echo "# write_timeline: ${SECS}s of 1M sequential overwrites (QD8) after a 2 GiB prefill and a ${WT_PAUSE:-6} s pause"
  echo "# git $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none); TARN=$TARN WT_TARN_SERVE=${WT_TARN_SERVE:-}"
  echo "# load at start $(cut -d' ' -f1-3 /proc/loadavg)"
  for t in ${WT_TARGETS:-tarn nbdkit}; do timeline "$t"; done
  echo "# load at end $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
echo "write_timeline: in $OUT"

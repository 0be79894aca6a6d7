#!/usr/bin/env bash
# Alternating A/B rounds of short fio jobs against NBD servers that stay up
# for the whole run: the warm 1M sequential read (issues 10 and 18), and
# optionally the other rows of bench/run.sh, with the page cache warm.
# Every target is prefilled once (2 GiB, 1M sequential writes, QD8); then
# each round runs every job on every target, the target order rotating per
# round, so neighbours' load hits all of them alike. Not part of the tests.
#
#   bash bench/warm_read.sh
# Env: TARN=target/release/tarn  TARN_B=/path/to/other/tarn (adds target tarn_b)
#      TARN_C=/path/to/a/third/tarn (adds target tarn_c, compared with both)
#      TARN_B_SERVE="--commit-interval 60"  TARN_B_CREATE="--no-checksums" (and
#      TARN_SERVE, TARN_CREATE, TARN_C_SERVE, TARN_C_CREATE): extra words for
#      that target's `serve` / `pool create` (the same binary twice, one option apart)
#      WARM_TARGETS="tarn nbdkit" (tarn_b is added when TARN_B is set)
#      WARM_JOBS="sr1m"  (any of sr1m sr1mp sw1m rr4k rw4k rr64k)  WARM_ROUNDS=6  WARM_SECS=4
#      WARM_SIZE=2G  WARM_DIR=/var/tmp/tarn-warm
#      WARM_RANDOM_FIRST="tarn_c" (these targets are first written at random,
#      4K QD32 for WARM_RANDOM_SECS=10 s, before the 1M prefill: the layout
#      bench/layout.sh reads; TARN_C may be the same binary as TARN)
# Prints one line per round and job (MiB/s or IOPS per target, the server's
# CPU microseconds per request, TCP retransmits machine-wide) and, per job, each
# target's min-max and its ratio to nbdkit per round (min, median, max);
# the table also goes to bench/results/<date>-warm.txt.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
TARGETS=${WARM_TARGETS:-tarn nbdkit}
[ -n "${TARN_B:-}" ] && TARGETS="$TARGETS tarn_b"
[ -n "${TARN_C:-}" ] && TARGETS="$TARGETS tarn_c"
JOBS=${WARM_JOBS:-sr1m}
ROUNDS=${WARM_ROUNDS:-6}
SECS=${WARM_SECS:-4}
SIZE=${WARM_SIZE:-2G}
DIR=${WARM_DIR:-/var/tmp/tarn-warm}
. "$REPO/bench/common.sh"
need_tools warm_read fio nbdkit nbdinfo python3
work_dir "$DIR" warm
declare -A URI PID
cleanup() {
  set +e
  for t in "${!PID[@]}"; do kill -TERM "${PID[$t]}" 2>/dev/null; done
  for t in "${!PID[@]}"; do wait "${PID[$t]}" 2>/dev/null; done
  rm -rf "$W"
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

start() { # start TARGET: a server on its own port, URI and PID set
  local t=$1 p bin
  p=$(port)
  mkdir -p "$W/$t"
  case $t in
    tarn|tarn_b|tarn_c)
      bin=$TARN; [ "$t" = tarn_b ] && bin=$TARN_B; [ "$t" = tarn_c ] && bin=$TARN_C
      local up=${t^^} create serve
      create="${up}_CREATE"; serve="${up}_SERVE"
      # shellcheck disable=SC2086 # the extra options: words on purpose
      "$bin" pool create "$W/$t/pool.img" --size "$(($(numfmt --from=iec "$SIZE") * 2))" ${!create:-} >/dev/null
      "$bin" vol create bench --size "$SIZE" -p "$W/$t/pool.img" >/dev/null
      # shellcheck disable=SC2086
      "$bin" serve -p "$W/$t/pool.img" --listen "127.0.0.1:$p" ${!serve:-} >"$W/$t/serve.log" 2>&1 &
      PID[$t]=$!; URI[$t]="nbd://127.0.0.1:$p/bench" ;;
    nbdkit)
      truncate -s "$SIZE" "$W/$t/disk.raw"
      nbdkit -f --exit-with-parent -i 127.0.0.1 -p "$p" file "$W/$t/disk.raw" >"$W/$t/nbdkit.log" 2>&1 &
      PID[$t]=$!; URI[$t]="nbd://127.0.0.1:$p/" ;;
    *) echo "warm_read: unknown target $t" >&2; exit 2 ;;
  esac
  local i
  for i in $(seq 1 150); do
    nbdinfo --size "${URI[$t]}" >/dev/null 2>&1 && return 0
    [ "$i" = 150 ] && { echo "warm_read: $t did not start" >&2; cat "$W/$t"/*.log >&2; exit 1; }
    sleep 0.2
  done
}

job_args() {
  case $1 in
    sr1m) echo "--rw=read --bs=1M --iodepth=8 --time_based --runtime=$SECS" ;;
    # One pass over the whole volume, as bench/layout.sh's reads (a 4 GiB
    # pass takes ~1 s warm: a connection's first moments weigh more).
    sr1mp) echo "--rw=read --bs=1M --iodepth=8" ;;
    sw1m) echo "--rw=write --bs=1M --iodepth=8 --time_based --runtime=$SECS" ;;
    rr4k) echo "--rw=randread --bs=4k --iodepth=32 --norandommap --randrepeat=0 --time_based --runtime=$SECS" ;;
    rw4k) echo "--rw=randwrite --bs=4k --iodepth=32 --norandommap --randrepeat=0 --time_based --runtime=$SECS" ;;
    # 64 KiB random reads: what a 4 KiB read would cost if it had to read
    # and verify a whole 64 KiB checksum group (issue 10's coarse sums).
    rr64k) echo "--rw=randread --bs=64k --iodepth=32 --norandommap --randrepeat=0 --time_based --runtime=$SECS" ;;
    *) echo "warm_read: unknown job $1" >&2; exit 2 ;;
  esac
}

# Server CPU ticks, exited threads included (a connection's threads end
# with it; per-thread counters such as context switches would go with them).
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# TCP segments retransmitted, machine-wide (loopback reordering shows here;
# other users' traffic too, so only a rough figure).
retrans() { awk '/^Tcp:/ {if (h) print $13; h = 1}' /proc/net/snmp; }

# run JOB TARGET: one time-based fio run; prints MiB/s (1M jobs) or IOPS,
# then the server's CPU microseconds per request.
run() {
  local js="$W/$1.$2.json" c0 c1 r0 r1
  c0=$(cpu "${PID[$2]}"); r0=$(retrans)
  # shellcheck disable=SC2046 # job_args: words on purpose
  timeout $((SECS + 120)) fio --name="$1" --ioengine=nbd --uri="${URI[$2]}" $(job_args "$1") \
    --size="$SIZE" --numjobs=1 --output-format=json --output="$js" >/dev/null 2>&1
  c1=$(cpu "${PID[$2]}"); r1=$(retrans)
  python3 - "$js" "$1" "$((c1 - c0))" "$(getconf CLK_TCK)" "$((r1 - r0))" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = j["read"] if j["read"]["io_bytes"] else j["write"]
n = max(side["total_ios"], 1)
v = f'{side["bw"] / 1024:.0f}' if "1m" in sys.argv[2] else f'{side["iops"]:.0f}'
us = int(sys.argv[3]) * 1e6 / int(sys.argv[4]) / n
print(f'{v}\t{us:.0f}\t{sys.argv[5]}')
EOF
}

read -r -a T <<<"$TARGETS"
for t in "${T[@]}"; do
  start "$t"
  if [[ " ${WARM_RANDOM_FIRST:-} " == *" $t "* ]]; then
    fio --name=randfirst --ioengine=nbd --uri="${URI[$t]}" --rw=randwrite --bs=4k --iodepth=32 --norandommap \
      --randrepeat=0 --time_based --runtime="${WARM_RANDOM_SECS:-10}" --size="$SIZE" --output=/dev/null >/dev/null 2>&1
  fi
  fio --name=prefill --ioengine=nbd --uri="${URI[$t]}" --rw=write --bs=1M --iodepth=8 --size="$SIZE" \
    --output=/dev/null >/dev/null 2>&1
done
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
RES="$W/results.tsv"
: >"$RES"
for r in $(seq 1 "$ROUNDS"); do
  n=${#T[@]}
  for job in $JOBS; do
    line="round $r $job:"
    for k in $(seq 0 $((n - 1))); do
      t=${T[$(((k + r) % n))]}
      IFS=$'\t' read -r v us rt <<<"$(run "$job" "$t")"
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$job" "$t" "$v" "$us" "$rt" >>"$RES"
      line="$line $t=$v (${us}us ${rt}rt)"
    done
    echo "$line"
  done
done
{
  echo "# warm_read: $ROUNDS rounds x ${SECS}s, $SIZE prefilled, fio nbd engine over TCP loopback, order rotating"
  echo "# git $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none); TARN=$TARN TARN_B=${TARN_B:-} TARN_C=${TARN_C:-} WARM_RANDOM_FIRST=${WARM_RANDOM_FIRST:-}"
  for v in TARN_CREATE TARN_SERVE TARN_B_CREATE TARN_B_SERVE TARN_C_CREATE TARN_C_SERVE; do
    if [ -n "${!v:-}" ]; then echo "# $v=${!v}"; fi
  done
  echo "# load at start $LOAD_START, at end $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 - "$RES" <<'EOF'
import sys, statistics as st
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
val = {(int(r), j, t): float(v) for r, j, t, v, _, _ in rows}
cpu = {(int(r), j, t): float(u) for r, j, t, _, u, _ in rows}
rtx = {(int(r), j, t): float(x) for r, j, t, _, _, x in rows}
for job in dict.fromkeys(j for _, j, _ in val):
    unit = "MiB/s" if "1m" in job else "IOPS"
    tgts = list(dict.fromkeys(t for (_, j, t) in val if j == job))
    for t in tgts:
        vs = [v for (r, j, tt), v in sorted(val.items()) if j == job and tt == t]
        line = f"{job} {t}: {unit} min {min(vs):.0f} median {st.median(vs):.0f} max {max(vs):.0f}"
        for peer in ("nbdkit", "tarn_b"):
            if peer == t or peer not in tgts:
                continue
            rs = [val[(r, job, t)] / val[(r, job, peer)] for (r, j, tt) in val
                  if j == job and tt == t and val.get((r, job, peer))]
            if rs:
                line += f"; /{peer} per round {min(rs):.2f}-{max(rs):.2f} median {st.median(rs):.2f}"
        us = [cpu[k] for k in cpu if k[1] == job and k[2] == t]
        line += f"; server CPU us/request {min(us):.0f}-{max(us):.0f} median {st.median(us):.0f}"
        rt = [rtx[k] for k in rtx if k[1] == job and k[2] == t]
        line += f"; TCP retransmits per run median {st.median(rt):.0f}"
        print(line)
EOF
} | tee "$OUT"
echo "warm_read: table in $OUT"

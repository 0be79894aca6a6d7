#!/usr/bin/env bash
# Profile one NBD server under one fio job: perf record -g attached to the
# server process while fio runs, then strace -c for a few seconds, with the
# requests served in that window counted from /proc/PID/io (socket + file
# bytes), so syscalls can be given per request. Not part of the tests.
#
#   bash bench/profile.sh TARGET WORKLOAD [OUTDIR]
#   TARGET: tarn | tarn_nosum | nbdkit     WORKLOAD: sw1m | sr1m (cold) | sr1mw (warm) | rw4k (random
#   first writes, QD32; request counts below are then in 4 KiB units)
# Env: TARN=target/release/tarn  PROF_SERVE_ARGS="--placement linear"  PROF_WARMUP=2  PROF_PERF_SECS=10  PROF_STRACE_SECS=4
#      PROF_SIZE=2G  PROF_DIR=/var/tmp/tarn-prof
# Output in OUTDIR (default /var/tmp/tarn-prof/out-TARGET-WORKLOAD):
# perf.data, report.txt (perf report --no-children --sort symbol),
# report-dso.txt, strace.txt, io.txt (bytes and requests in the strace window).
set -euo pipefail
TGT=${1:?target}; WL=${2:?workload}
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
DIR=${PROF_DIR:-/var/tmp/tarn-prof}
OUT=${3:-$DIR/out-$TGT-$WL}
SIZE=${PROF_SIZE:-2G}
PERF_SECS=${PROF_PERF_SECS:-10}
STRACE_SECS=${PROF_STRACE_SECS:-4}
mkdir -p "$DIR" "$OUT"
W=$(mktemp -d "$DIR/w.XXXX")
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
SRV=
FIO=
cleanup() {
  set +e
  [ -n "$FIO" ] && kill "$FIO" 2>/dev/null && wait "$FIO" 2>/dev/null
  [ -n "$SRV" ] && kill -TERM "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
case $TGT in
  tarn|tarn_nosum)
    extra=(); [ "$TGT" = tarn_nosum ] && extra=(--no-checksums)
    "$TARN" pool create "$W/pool.img" --size "$(( $(numfmt --from=iec "$SIZE") * 2 ))" "${extra[@]}" >/dev/null
    "$TARN" vol create bench --size "$SIZE" -p "$W/pool.img" >/dev/null
    # shellcheck disable=SC2086 # PROF_SERVE_ARGS: words on purpose
    "$TARN" serve -p "$W/pool.img" --listen "127.0.0.1:$PORT" ${PROF_SERVE_ARGS:-} >"$W/serve.log" 2>&1 &
    SRV=$!; NAME=bench ;;
  nbdkit)
    truncate -s "$SIZE" "$W/disk.raw"
    nbdkit -f --exit-with-parent -i 127.0.0.1 -p "$PORT" file "$W/disk.raw" >"$W/nbdkit.log" 2>&1 &
    SRV=$!; NAME= ;;
  *) echo "unknown target $TGT" >&2; exit 2 ;;
esac
URI="nbd://127.0.0.1:$PORT/$NAME"
for _ in $(seq 1 100); do nbdinfo --size "$URI" >/dev/null 2>&1 && break; sleep 0.2; done
case $WL in
  sw1m) args=(--rw=write --bs=1M --iodepth=8) ;;
  rw4k) args=(--rw=randwrite --bs=4k --iodepth=32 --norandommap --randrepeat=0) ;;
  sr1m|sr1mw) args=(--rw=read --bs=1M --iodepth=8)
        fio --name=prefill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 --size="$SIZE" \
          --output=/dev/null >/dev/null 2>&1
        [ "$WL" = sr1m ] && { sync; echo 3 >/proc/sys/vm/drop_caches; } ;;
  *) echo "unknown workload $WL" >&2; exit 2 ;;
esac
RUN=$((${PROF_WARMUP:-2} + PERF_SECS + STRACE_SECS + 6))
fio --name="$WL" --ioengine=nbd --uri="$URI" "${args[@]}" --time_based --runtime=$RUN --size="$SIZE" \
  --numjobs=1 --output-format=json --output="$OUT/fio.json" >/dev/null 2>&1 &
FIO=$!
sleep "${PROF_WARMUP:-2}"   # PROF_WARMUP: seconds of fio before perf starts
echo "load before perf: $(cut -d' ' -f1-3 /proc/loadavg)" >"$OUT/io.txt"
io() { awk '/^(rchar|wchar)/ {printf "%s ", $2}' "/proc/$SRV/io"; }
# CPU ticks (utime+stime of all threads) and context switches of the server
cpu() { awk '{print $14 + $15}' "/proc/$SRV/stat"; }
csw() { cat /proc/$SRV/task/*/status | awk '/ctxt_switches/ {n += $2} END {print n}'; }
read -r pr0 pw0 <<<"$(io)"; c0=$(cpu); x0=$(csw)
perf record -g -o "$OUT/perf.data" -p "$SRV" -- sleep "$PERF_SECS" >/dev/null 2>&1
read -r pr1 pw1 <<<"$(io)"; c1=$(cpu); x1=$(csw)
UNIT=1048576; [ "$WL" = rw4k ] && UNIT=4096
if [[ $WL != sr1m* ]]; then preq=$(( (pw1 - pw0) / UNIT )); else preq=$(( (pr1 - pr0) / UNIT )); fi
tck=$(getconf CLK_TCK)
{ echo "perf window ${PERF_SECS}s: ~$preq 1 MiB requests ($((preq / PERF_SECS)) /s), server CPU $(( (c1 - c0) * 1000 / tck )) ms" \
    "= $(( preq > 0 ? (c1 - c0) * 1000000 / tck / preq : 0 )) us CPU per request, $(( preq > 0 ? (x1 - x0) / preq : 0 )) context switches per request"; } >>"$OUT/io.txt"
read -r r0 w0 <<<"$(io)"
timeout -s INT "$STRACE_SECS" strace -c -f -p "$SRV" -o "$OUT/strace.txt" >/dev/null 2>&1 || true
read -r r1 w1 <<<"$(io)"
# rchar/wchar count read/pread and write/pwrite bytes, not recv/sendmsg:
# the payload's file I/O gives the number of 1 MiB requests
if [[ $WL != sr1m* ]]; then req=$(( (w1 - w0) / UNIT )); else req=$(( (r1 - r0) / UNIT )); fi
{ echo "strace window ${STRACE_SECS}s: rchar +$((r1 - r0)) wchar +$((w1 - w0)) => ~$req 1 MiB requests"
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"; } >>"$OUT/io.txt"
wait "$FIO" || true; FIO=
set +o pipefail
perf report -i "$OUT/perf.data" --no-children --sort symbol --stdio 2>/dev/null | grep -v '^$' | head -400 >"$OUT/report.txt"
perf report -i "$OUT/perf.data" --no-children --sort symbol --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40 >"$OUT/report-flat.txt"
perf report -i "$OUT/perf.data" --no-children --sort comm,dso --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -20 >"$OUT/report-dso.txt"
PYTHONPATH="$REPO/bench" python3 -c 'import sys,fio_json as f;r=f.summarize(f.load_job(sys.argv[1]));print("fio whole run (perturbed by perf/strace): %.0f IOPS %.1f MB/s" % (r["iops"], r["mbs"]))' "$OUT/fio.json" >>"$OUT/io.txt" 2>/dev/null || true
cat "$OUT/io.txt"

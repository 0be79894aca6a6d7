#!/usr/bin/env bash
# Member evacuation (`tarn dev remove`) against its peers, in one run.
# A pool of a 4x primary and a 5x member: the volume, filled sequentially,
# lands on the member (the roomiest); page caches are dropped before
# every copy and evacuation. Per round, in alternating order:
#  - idle: `tarn dev remove 1` through the served pool, no client; its
#    rate (live MiB moved / wall time) against a sequential copy of as
#    many MiB between the same files' file system (dd read of the member
#    file into a scratch file, conv=fsync, caches dropped): the peer a
#    user would otherwise use, `cp` of the data;
#  - loaded: the same evacuation while fio writes 4 KiB at random (QD16)
#    over NBD for the idle evacuation's duration; the client's IOPS
#    against the same fio run with no evacuation, and the evacuation's
#    rate against the idle one.
# Between runs the member file is added back (a finished removal takes it
# out of the pool; a cut one is cancelled) and a rewrite of the volume puts
# the data back on it. Targets (issue 12): evacuation >= 0.5x
# the sequential copy; clients keep >= 0.5x their IOPS. Not part of the tests.
#
#   bash bench/evacuate.sh
# Env: BENCH_SIZE=1G (volume = live data), BENCH_ROUNDS=3,
#      BENCH_DIR=/var/tmp/tarn-bench, TARN=target/release/tarn
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$BENCH/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
SIZE=${BENCH_SIZE:-1G}
ROUNDS=${BENCH_ROUNDS:-3}
DIR=${BENCH_DIR:-/var/tmp/tarn-bench}/evacuate.$$
OUT=$BENCH/results/$(date +%Y-%m-%d-%H%M)-evacuate.txt
export LC_ALL=C
mkdir -p "$DIR" "$BENCH/results"
SRV=
cleanup() { [ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
now() { date +%s.%N; }
py() { python3 -c "$1"; }
size_mib=$(numfmt --from=iec "$SIZE" | awk '{ print int($1 / 1048576) }')

pool=$DIR/pool.img
"$TARN" pool create "$pool" --size $((size_mib * 4))M >/dev/null
"$TARN" vol create bench --size "$SIZE" -p "$pool" >/dev/null
"$TARN" dev add "$DIR/d1.img" --size $((size_mib * 5))M -p "$pool" >/dev/null
port=$(py 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
"$TARN" serve -p "$pool" --listen "127.0.0.1:$port" --socket "$DIR/s.sock" >"$DIR/serve.log" 2>&1 &
SRV=$!
for _ in $(seq 1 100); do nbdinfo --size "nbd://127.0.0.1:$port/bench" >/dev/null 2>&1 && break; sleep 0.1; done
uri=nbd://127.0.0.1:$port/bench
fill() {
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size="$SIZE" --output=/dev/null >/dev/null
}
# randw SECONDS: 4 KiB random writes for that long; prints IOPS
randw() {
  fio --name=rw --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=16 --size="$SIZE" \
    --time_based --runtime="$1" --output-format=json --output="$DIR/rw.json" >/dev/null
  py "import json;print(round(json.load(open('$DIR/rw.json'))['jobs'][0]['write']['iops']))"
}
# The member's index, in a file: a finished removal takes the member out of
# the pool (its slot stays, REMOVED), so the file is added back as a new
# member, with a new index; evac runs in a subshell.
echo 1 >"$DIR/member"
live() {
  "$TARN" pool status -p "$pool" --json |
    py "import json,sys;d=[x for x in json.load(sys.stdin)['devices'] if x['index']==$(cat "$DIR/member")][0];print((d['data']-d['free'])>>20)"
}
# evac: prints "MiB seconds" of one `dev remove`, then puts the member back
evac() {
  local t0 t1 out m
  m=$(cat "$DIR/member")
  drop_caches
  t0=$(now)
  out=$("$TARN" dev remove "$m" -p "$pool" --json)
  t1=$(now)
  if py "import json;exit(0 if json.loads('''$out''')['removed'] else 1)"; then
    "$TARN" dev add "$DIR/d1.img" -p "$pool" | sed -n 's/.* as device \([0-9]*\):.*/\1/p' >"$DIR/member"
  else
    "$TARN" dev remove --cancel "$m" -p "$pool" >/dev/null
  fi
  py "import json;j=json.loads('''$out''');print(j['moved_bytes']>>20, round($t1-$t0, 2), j['live_bytes']>>20)"
}
copy_rate() { # MiB: sequential copy of the member file's first MiB
  drop_caches
  local t0 t1
  t0=$(now)
  dd if="$DIR/d1.img" of="$DIR/copy.img" bs=1M count="$1" conv=fsync status=none
  t1=$(now)
  rm -f "$DIR/copy.img"
  py "print(round($1/($t1-$t0)))"
}

{
  echo "evacuation benchmark $(date +%F\ %T), $(git -C "$REPO" rev-parse --short HEAD), fs $(df --output=fstype "$DIR" | tail -1), load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
  echo "volume $SIZE filled sequentially; primary $((size_mib * 4)) MiB, member 1 $((size_mib * 5)) MiB"
  for r in $(seq 1 "$ROUNDS"); do
    fill
    on=$(live)
    copy=$(copy_rate "$on")
    read -r m1 t1 l1 < <(evac)
    idle=$(py "print(round($m1/$t1))")
    fill
    secs=$(py "print(max(3, round($t1)))")
    if [ $((r % 2)) = 1 ]; then
      base=$(randw "$secs"); fill
      randw "$secs" >"$DIR/iops" & F=$!; read -r m2 t2 l2 < <(evac); wait $F; loaded_iops=$(cat "$DIR/iops")
    else
      randw "$secs" >"$DIR/iops" & F=$!; read -r m2 t2 l2 < <(evac); wait $F; loaded_iops=$(cat "$DIR/iops"); fill
      base=$(randw "$secs")
    fi
    loaded=$(py "print(round($m2/$t2))")
    echo "round $r: $on MiB in use on member 1; copy $copy MiB/s; evacuation idle $m1 MiB of $l1 live in ${t1}s = $idle MiB/s = $(py "print(f'{$idle/$copy:.2f}')")x copy;" \
      "under 4K randwrite: $m2 MiB of $l2 live in ${t2}s = $loaded MiB/s ($(py "print(f'{$loaded/$idle:.2f}')")x idle); client IOPS $loaded_iops vs $base alone = $(py "print(f'{$loaded_iops/max($base,1):.2f}')")x"
  done
} | tee "$OUT"

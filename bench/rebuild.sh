#!/usr/bin/env bash
# Rebuild of a missing parity member (`tarn pool replace 3 NEW` of an
# UNAVAIL member) against a plain copy of a member, in alternating rounds.
# A pool of four 512 MiB files holding a 3+1 parity volume written full
# (BENCH_SIZE, default 384M) over NBD; member 3's file is then set aside,
# and each round restores the three others from a saved copy (the pool
# DEGRADED again), evicts its files from the page cache and times, in
# alternating order:
#  - rebuild: offline `tarn pool replace 3 new.img --size 512M` (MiB of
#    the member rebuilt / wall time of the command);
#  - copy: `dd if=m1.img of=copy bs=1M count=<member MiB> conv=fsync`,
#    the plain copy of as much of a member (the peer: what a user would
#    run to copy a disk);
#  - loaded (BENCH_LOADED=1): the rebuild through a served pool while fio
#    writes 4 KiB at random (QD16) to the volume with crc32c verify.
# Target (issue 12, the rebuild): >= 0.5x the copy. Not part of the tests.
#
#   bash bench/rebuild.sh
# Env: BENCH_SIZE=384M, BENCH_ROUNDS=2, BENCH_LOADED=1,
#      BENCH_DIR=/var/tmp/tarn-bench, TARN=target/release/tarn
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
. "$BENCH/common.sh"
REPO=$(cd "$BENCH/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
SIZE=${BENCH_SIZE:-384M}
ROUNDS=${BENCH_ROUNDS:-2}
LOADED=${BENCH_LOADED:-1}
DIR=${BENCH_DIR:-/var/tmp/tarn-bench}/rebuild.$$
OUT=$BENCH/results/$(date +%Y-%m-%d-%H%M%S)-rebuild.txt
export LC_ALL=C
mkdir -p "$DIR" "$BENCH/results"
SRV=
cleanup() { [ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
# Only this bench's files leave the page cache (fdatasync +
# POSIX_FADV_DONTNEED each): dropping the whole cache (echo 3 >
# drop_caches, what this bench did before) disturbs every other user.
drop_caches() { evict_files "$DIR"/*.img "$DIR"/saved/*.img "$DIR"/m3.gone; }
now() { date +%s.%N; }
say() { echo "$*" | tee -a "$OUT"; }
POOL=$DIR/pool.img
PORT=$((20000 + $$ % 20000))

serve() {
  "$TARN" serve -p "$POOL" --listen "127.0.0.1:$PORT" >>"$DIR/serve.log" 2>&1 & SRV=$!
  for _ in $(seq 1 100); do nbdinfo --list "nbd://127.0.0.1:$PORT" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "tarn serve did not start" >&2; exit 1
}
unserve() { kill -TERM "$SRV"; wait "$SRV" || true; SRV=; }

for i in 1 2 3; do truncate -s 512M "$DIR/m$i.img"; done
"$TARN" pool create "$POOL" --size 512M --device "$DIR/m1.img" --device "$DIR/m2.img" --device "$DIR/m3.img" >/dev/null
"$TARN" vol create p --size "$SIZE" --parity 3 -p "$POOL" >/dev/null
head -c "$(numfmt --from=iec "$SIZE")" /dev/urandom >"$DIR/src.raw"
serve
nbdcopy "$DIR/src.raw" "nbd://127.0.0.1:$PORT/p"
unserve
mv "$DIR/m3.img" "$DIR/m3.gone"
mkdir -p "$DIR/saved"
for f in pool m1 m2; do cp --sparse=always "$DIR/$f.img" "$DIR/saved/$f.img"; done
restore() { for f in pool m1 m2; do cp --sparse=always "$DIR/saved/$f.img" "$DIR/$f.img"; done; rm -f "$DIR/new.img" "$DIR/copy"; }

say "# bench/rebuild.sh $(date -u +%FT%TZ) size=$SIZE rounds=$ROUNDS load=$(cut -d' ' -f1 /proc/loadavg) $(git -C "$REPO" rev-parse --short HEAD)"
rebuild() { # offline; prints MiB rebuilt and seconds
  restore; drop_caches
  local t0 t1 out
  t0=$(now)
  out=$("$TARN" pool replace 3 "$DIR/new.img" --size 512M -p "$POOL" --json)
  t1=$(now)
  echo "$out" | jq -r --arg t "$(echo "$t1 - $t0" | bc)" '"\(.rebuilt_bytes / 1048576) \($t)"'
}
copy() { # MIB: prints seconds of dd conv=fsync
  restore; drop_caches
  local t0 t1
  t0=$(now)
  dd if="$DIR/m1.img" of="$DIR/copy" bs=1M count="$1" conv=fsync status=none
  t1=$(now)
  echo "$t1 - $t0" | bc
}
loaded() { # served, fio writes 4K at random meanwhile; prints MiB and seconds
  restore; drop_caches; serve
  (cd "$DIR" && fio --name=load --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/p" --rw=randwrite --bs=4k --iodepth=16 \
    --size=64M --time_based --runtime=600 --verify=crc32c --output="$DIR/fio.out" >/dev/null 2>&1) & local FIO=$!
  sleep 1
  local t0 t1 out
  t0=$(now)
  out=$("$TARN" pool replace 3 "$DIR/new.img" --size 512M -p "$POOL" --json)
  t1=$(now)
  # The load only: its verify is not what is measured.
  kill -KILL "$FIO" 2>/dev/null; pkill -KILL -P "$FIO" 2>/dev/null || true; wait "$FIO" 2>/dev/null || true
  unserve
  echo "$out" | jq -r --arg t "$(echo "$t1 - $t0" | bc)" '"\(.rebuilt_bytes / 1048576) \($t)"'
}
COPY_MIB=$(( $(numfmt --from=iec "$SIZE") / 3 / 1048576 ))
for r in $(seq 1 "$ROUNDS"); do
  # A member holds a quarter of data and parity: a third of the data.
  if [ $((r % 2)) = 1 ]; then read -r mib rs < <(rebuild); cs=$(copy "$COPY_MIB"); else cs=$(copy "$COPY_MIB"); read -r mib rs < <(rebuild); fi
  ratio=$(echo "scale=3; ($mib / $rs) / ($COPY_MIB / $cs)" | bc)
  say "round $r: rebuild ${mib} MiB in ${rs}s ($(echo "scale=1; $mib / $rs" | bc) MiB/s); dd copy of ${COPY_MIB} MiB in ${cs}s ($(echo "scale=1; $COPY_MIB / $cs" | bc) MiB/s): ${ratio}x"
  if [ "$LOADED" = 1 ]; then
    read -r lmib ls < <(loaded)
    say "round $r: rebuild under fio 4K randwrite QD16: ${lmib} MiB in ${ls}s ($(echo "scale=1; $lmib / $ls" | bc) MiB/s): $(echo "scale=3; ($lmib / $ls) / ($COPY_MIB / $cs)" | bc)x the copy"
  fi
done
say "results in $OUT"

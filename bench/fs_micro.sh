#!/usr/bin/env bash
# The Loris micro-benchmark (shared/seeds 004) on a tarn file volume:
# write FILES files of 1 MiB, and one file of FILES MiB, then rewrite
# them whole, RUNS times, with after each run either nothing (none), a
# volume snapshot (snap: setfattr user.tarn.snapshot) or, with the `*`
# rule, the close versions every rewrite takes (ver). Times per run
# (write + fsync of the mount root), ms; modes alternate per round
# (forward, then backward); medians and the ratio to none.
#   bash bench/fs_micro.sh                # FILES=500 RUNS=4 ROUNDS=2
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
FILES=${FILES:-500}
RUNS=${RUNS:-4}
ROUNDS=${ROUNDS:-2}
. "$REPO/bench/fs_common.sh"
fs_bench_setup fsmicro

# one MODE SHAPE: RUNS rewrites on a fresh volume; prints the median ms
one() {
  rm -f "$POOL"
  "$TARN" pool create "$POOL" --size 8G >/dev/null
  "$TARN" fs create home -p "$POOL" >/dev/null
  [ "$1" = ver ] && "$TARN" fs version-policy home add '*' -p "$POOL" >/dev/null
  mount_fs
  local r t0 t1
  for r in $(seq 1 "$RUNS"); do
    t0=$(now)
    case $2 in
      small) for i in $(seq 1 "$FILES"); do dd if=/dev/zero of="$MNT/f$i" bs=1M count=1 status=none; done ;;
      large) dd if=/dev/zero of="$MNT/big" bs=1M count="$FILES" status=none ;;
    esac
    sync "$MNT"
    [ "$1" = snap ] && setfattr -n user.tarn.snapshot -v "r$r" "$MNT"
    t1=$(now)
    echo $(((t1 - t0) / 1000000))
  done | median
  umount_fs
}

echo "# bench/fs_micro.sh FILES=$FILES RUNS=$RUNS ROUNDS=$ROUNDS $(date -u +%FT%TZ) (git $(git -C "$REPO" rev-parse --short HEAD))"
declare -A T
for r in $(seq 1 "$ROUNDS"); do
  modes="none snap ver"
  [ $((r % 2)) = 0 ] && modes="ver snap none"
  for shape in small large; do
    for m in $modes; do
      ms=$(one "$m" "$shape")
      echo "round $r $shape $m: median run $ms ms"
      T[$shape-$m]="${T[$shape-$m]:-} $ms"
    done
  done
done
for shape in small large; do
  base=$(echo "${T[$shape-none]}" | tr ' ' '\n' | grep . | median)
  for m in none snap ver; do
    med=$(echo "${T[$shape-$m]}" | tr ' ' '\n' | grep . | median)
    echo "$shape $m: median $med ms (rounds:${T[$shape-$m]}), $(awk -v a="$med" -v b="$base" 'BEGIN { printf "%.2fx", a / b }') of none"
  done
done

#!/usr/bin/env bash
# The application-level run of issue 15 (Loris section VII's other
# workload): copy a source tree, build it, find and grep through it, on
# the three targets of bench/fs_targets.sh (tarn file volume; ext4 on a
# tarn block volume through nbdfuse + loop; ext4 on a raw loop device)
# with no versioning, volume snapshots every SNAP_EVERY s during the run
# (tarnfs, ext4nbd), and close versions of every file (tarnfs).
# Offline trees (no download): APP_SRC (default: the aws-lc-sys crate's
# sources in the cargo registry, ~2,000 files, 69 MB) is copied, found
# and grepped; APP_BUILD (default: libfuzzer from the libfuzzer-sys
# crate, 31 C++ files) is copied and built with make -j2 (c++ -O0) into
# an archive. Phases, each timed (wall ms): cp (cp -a of both trees),
# build, find (find -type f | wc, stat of every file), grep (grep -r over
# the copy), then sync -f; the total is their sum. Rounds alternate the
# order of the configs. Needs root, make, c++, nbdfuse, e2fsprogs, attr.
#   ROUNDS=2 bash bench/fs_app.sh
#   CONFIGS="ext4raw-none tarnfs-none" ROUNDS=1 bash bench/fs_app.sh
# Output: stdout and bench/results/<date>-fs_app.txt
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$BENCH/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
ROUNDS=${ROUNDS:-2}
SNAP_EVERY=${SNAP_EVERY:-2}
SNAP_KEEP=${SNAP_KEEP:-5}
CONFIGS=${CONFIGS:-ext4raw-none ext4nbd-none ext4nbd-snap tarnfs-none tarnfs-snap tarnfs-ver}
DIR=${DIR:-/var/tmp/tarn-fs-app}
PORT=${PORT:-10881}
SIZE=${SIZE:-8G}
VOL_SIZE=$(( ${SIZE%G} * 3 / 4 ))G
REG=$(ls -d "$HOME"/.cargo/registry/src/*/ 2>/dev/null | head -n 1)
APP_SRC=${APP_SRC:-$(ls -d "$REG"aws-lc-sys-* 2>/dev/null | head -n 1)}
APP_BUILD=${APP_BUILD:-$(ls -d "$REG"libfuzzer-sys-*/libfuzzer 2>/dev/null | head -n 1)}
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
OUT=$BENCH/results/$STAMP-fs_app.txt
for c in make c++ ar nbdfuse nbdinfo fusermount3 losetup mkfs.ext4 setfattr; do
  command -v $c >/dev/null || { echo "fs_app.sh: $c missing, run: bash scripts/deps.sh" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "fs_app.sh: needs root (loop device, mount)" >&2; exit 1; }
[ -x "$TARN" ] || { echo "fs_app.sh: $TARN not built (cargo build --release -p tarn-cli)" >&2; exit 1; }
[ -d "$APP_SRC" ] || { echo "fs_app.sh: no source tree '$APP_SRC' (set APP_SRC to a directory)" >&2; exit 1; }
[ -d "$APP_BUILD" ] && ls "$APP_BUILD"/*.cpp >/dev/null 2>&1 ||
  { echo "fs_app.sh: no C++ tree '$APP_BUILD' (set APP_BUILD to a directory of .cpp files)" >&2; exit 1; }
mkdir -p "$DIR" "$BENCH/results"
. "$BENCH/fs_targets.sh"
trap teardown EXIT
exec > >(tee "$OUT") 2>&1

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

# one CONFIG: writes "cp build find grep total snaps" (ms) to $DIR/result
one() {
  local kind=${1%-*} mode=${1#*-} t t0 cp build find grep
  setup "$kind" "$mode"
  echo 0 >"$DIR/snaps"
  sync
  t0=$(date +%s%N)
  if [ "$mode" = snap ]; then ticker "$kind" & TICK=$!; fi
  t=$(date +%s%N)
  cp -a "$APP_SRC" "$MNT/src" && cp -a "$APP_BUILD" "$MNT/build"
  cp=$(ms "$t") t=$(date +%s%N)
  printf 'SRCS := $(wildcard *.cpp)\nlibfuzzer.a: $(SRCS:.cpp=.o)\n\tar rcs $@ $^\n%%.o: %%.cpp\n\t$(CXX) -O0 -std=c++17 -c $< -o $@\n' >"$MNT/build/Makefile"
  make -s -j2 -C "$MNT/build" >"$DIR/make.log" 2>&1 || echo "make failed: $(tail -n 3 "$DIR/make.log")" >&2
  build=$(ms "$t") t=$(date +%s%N)
  find "$MNT" -type f | wc -l >/dev/null && find "$MNT" -type f -exec stat -c %s {} + >/dev/null
  find=$(ms "$t") t=$(date +%s%N)
  grep -r -c -e 'static' -e 'EVP_' "$MNT" >/dev/null || true
  grep=$(ms "$t")
  sync -f "$MNT" || echo "sync -f failed" >&2
  total=$(ms "$t0")
  [ -n "$TICK" ] && { kill "$TICK"; wait "$TICK" || true; TICK=; }
  [ -f "$MNT/build/libfuzzer.a" ] || echo "no libfuzzer.a built" >&2
  local tarnfs=$MOUNT_PID fuse=-
  teardown
  [ -n "$tarnfs" ] && fuse=$(fuse_transport)
  echo "$cp $build $find $grep $total $(cat "$DIR/snaps") $fuse" >"$DIR/result"
}

echo "# bench/fs_app.sh $STAMP: fuse enable_uring=$(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null || echo -) ROUNDS=$ROUNDS SNAP_EVERY=$SNAP_EVERY SNAP_KEEP=$SNAP_KEEP src=$APP_SRC build=$APP_BUILD ($(uname -r), $(nproc) cpus, git $(git -C "$REPO" rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg))"
read -r -a LIST <<<"$CONFIGS"
declare -A TOTAL
for r in $(seq 1 "$ROUNDS"); do
  round_order "$r"
  for c in "${ORDER[@]}"; do
    one "$c"
    read -r cp build find grep total snaps fuse <"$DIR/result"
    echo "round $r $c: total ${total} ms (cp $cp, build $build, find $find, grep $grep; snapshots $snaps; fuse requests: $fuse; load $(cut -d' ' -f1 /proc/loadavg))"
    TOTAL[$c]="${TOTAL[$c]:-} $total"
  done
done

echo "# config: median total ms [min-max] of $ROUNDS, ratio to ext4raw-none median"
base=
[ -n "${TOTAL[ext4raw-none]:-}" ] && read -r base _ _ < <(echo "${TOTAL[ext4raw-none]}" | stats)
for c in "${LIST[@]}"; do
  read -r med lo hi < <(echo "${TOTAL[$c]}" | stats)
  ratio=$([ -n "$base" ] && awk -v a="$med" -v b="$base" 'BEGIN { printf "%.2fx", a / b }' || echo -)
  echo "$c: $med ms [$lo-$hi] $ratio"
done
echo "results: $OUT"

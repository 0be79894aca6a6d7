#!/usr/bin/env bash
# PostMark as Loris configured it (shared/seeds 004, section VII: 20,000
# transactions on 5,000 files in 10 subdirectories, sizes 4 KiB-1 MiB,
# 4 KiB reads and writes) on:
#   tarnfs  a tarn file volume (`tarn mount`, FUSE)
#   ext4nbd ext4 on a tarn block volume (`tarn serve`, nbdfuse + loop)
#   ext4raw ext4 on a loop device over a plain sparse file (the baseline)
# each in modes:
#   none    no versioning
#   snap    a volume snapshot every SNAP_EVERY s during the run, the last
#           SNAP_KEEP (5) kept (tarnfs: setfattr user.tarn.snapshot and
#           .delete on the mount; ext4nbd: tarn snap create and delete
#           through the server; ext4raw has none)
#   ver     open-close versioning of every file (`*` rule; tarnfs only)
# Each run is a fresh file system; the time measured is PostMark's run
# plus a `sync -f` of the file system (so no one keeps the data in page
# cache only), wall clock. Rounds alternate the order of the configs
# (forward, then backward). Reported: per config the median, min and max
# of ROUNDS, the ratio of medians against ext4raw-none, and PostMark's own
# transaction seconds.
# Needs root (loop, mount), postmark, nbdfuse, e2fsprogs, attr.
#   bash bench/postmark.sh                        # full: PM_TX=20000 PM_FILES=5000 ROUNDS=3
#   PM_TX=2000 PM_FILES=500 ROUNDS=1 bash bench/postmark.sh   # smoke run
#   TARN_BASE=OLD CONFIGS="tarnfsbase-ver tarnfs-ver" bash bench/postmark.sh   # A/B
# Env: CONFIGS (default all six), SNAP_EVERY=2, DIR=/var/tmp/tarn-postmark
# Output: stdout and bench/results/<date>-postmark.txt
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$BENCH/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
PM_TX=${PM_TX:-20000}
PM_FILES=${PM_FILES:-5000}
ROUNDS=${ROUNDS:-3}
SNAP_EVERY=${SNAP_EVERY:-2}
SNAP_KEEP=${SNAP_KEEP:-5}
CONFIGS=${CONFIGS:-ext4raw-none ext4nbd-none ext4nbd-snap tarnfs-none tarnfs-snap tarnfs-ver}
DIR=${DIR:-/var/tmp/tarn-postmark}
PORT=${PORT:-10879}
SIZE=${SIZE:-8G}
VOL_SIZE=$(( ${SIZE%G} * 3 / 4 ))G
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
OUT=$BENCH/results/$STAMP-postmark.txt
for c in postmark nbdfuse nbdinfo fusermount3 losetup mkfs.ext4 setfattr; do
  command -v $c >/dev/null || { echo "postmark.sh: $c missing, run: bash scripts/deps.sh" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "postmark.sh: needs root (loop device, mount)" >&2; exit 1; }
[ -x "$TARN" ] || { echo "postmark.sh: $TARN not built (cargo build --release -p tarn-cli)" >&2; exit 1; }
mkdir -p "$DIR" "$BENCH/results"
. "$BENCH/fs_targets.sh"
trap teardown EXIT
exec > >(tee "$OUT") 2>&1


# one CONFIG: writes "wall_ms tx_s snaps" to $DIR/result
one() {
  local kind=${1%-*} mode=${1#*-} t0 t1 tx
  setup "$kind" "$mode"
  printf 'set location %s\nset number %s\nset transactions %s\nset subdirectories 10\nset size 4096 1048576\nset read 4096\nset write 4096\nset buffering false\nrun\nquit\n' \
    "$MNT" "$PM_FILES" "$PM_TX" >"$DIR/pm.cfg"
  echo 0 >"$DIR/snaps"
  sync
  t0=$(date +%s%N)
  if [ "$mode" = snap ]; then ticker "$kind" & TICK=$!; fi
  postmark "$DIR/pm.cfg" >"$DIR/pm.out" || echo "postmark failed: $(tail -n 2 "$DIR/pm.out")" >&2
  sync -f "$MNT" || echo "sync -f failed" >&2
  t1=$(date +%s%N)
  [ -n "$TICK" ] && { kill "$TICK"; wait "$TICK" || true; TICK=; }
  tx=$(sed -n 's/^[[:space:]]*\([0-9]*\) seconds of transactions.*/\1/p' "$DIR/pm.out")
  # the tarn mount's peak RSS (MiB)
  # and its CPU seconds (user + system; steadier than wall time when
  # other work shares the machine)
  local hwm=- cpu=- tarnfs=$MOUNT_PID
  [ -n "$MOUNT_PID" ] && hwm=$(awk '/^VmHWM/ { print int($2 / 1024) }' "/proc/$MOUNT_PID/status")
  [ -n "$MOUNT_PID" ] && cpu=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$MOUNT_PID/stat")
  teardown
  local fuse=-
  [ -n "$tarnfs" ] && fuse=$(fuse_transport)
  echo "$(((t1 - t0) / 1000000)) ${tx:-?} $(cat "$DIR/snaps") $hwm $cpu $fuse" >"$DIR/result"
}

echo "# bench/postmark.sh $STAMP: fuse enable_uring=$(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null || echo -) PM_TX=$PM_TX PM_FILES=$PM_FILES ROUNDS=$ROUNDS SNAP_EVERY=$SNAP_EVERY SNAP_KEEP=$SNAP_KEEP TARNFS_MOUNT_ARGS=\"$TARNFS_MOUNT_ARGS\" TARN=$TARN${TARN_BASE:+ TARN_BASE=$TARN_BASE} ($(uname -r), $(nproc) cpus, git $(git -C "$REPO" rev-parse --short HEAD))"
read -r -a LIST <<<"$CONFIGS"
declare -A WALL TX
for r in $(seq 1 "$ROUNDS"); do
  round_order "$r"
  for c in "${ORDER[@]}"; do
    one "$c"
    read -r ms tx snaps hwm cpu fuse <"$DIR/result"
    echo "round $r $c: ${ms} ms (postmark transactions ${tx} s, snapshots $snaps, mount peak RSS ${hwm} MiB, mount CPU ${cpu} s, fuse requests: $fuse; load $(cut -d" " -f1 /proc/loadavg))"
    WALL[$c]="${WALL[$c]:-} $ms"
    TX[$c]="${TX[$c]:-} $tx"
  done
done

echo "# config: median wall ms [min-max] of $ROUNDS, ratio to ext4raw-none median; postmark transaction s"
base=
[ -n "${WALL[ext4raw-none]:-}" ] && read -r base _ _ < <(echo "${WALL[ext4raw-none]}" | stats)
for c in "${LIST[@]}"; do
  read -r med lo hi < <(echo "${WALL[$c]}" | stats)
  ratio=$([ -n "$base" ] && awk -v a="$med" -v b="$base" 'BEGIN { printf "%.2fx", a / b }' || echo -)
  echo "$c: $med ms [$lo-$hi] $ratio; tx s:${TX[$c]}"
done
echo "results: $OUT"

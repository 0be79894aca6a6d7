#!/usr/bin/env bash
# One large directory: N empty files created (open + close) in one
# directory, then all unlinked, by one Python process, on a tarn file
# volume (tarnfs; with TARN_BASE also tarnfsbase, an older binary) and on
# ext4 on a raw loop device (ext4raw). Prints the create time per
# quarter of N (a directory rewritten whole per change grows each
# quarter: quadratic), the totals, and the ratio to ext4raw; configs
# alternate per round (forward, then backward); medians.
#   bash bench/fs_bigdir.sh                  # N=20000 ROUNDS=2
#   TARN_BASE=OLD N=20000 bash bench/fs_bigdir.sh   # A/B
# Needs root (loop device, mount). Output: stdout and
# bench/results/<date>-fs_bigdir.txt
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARN_NEW=${TARN:-$REPO/target/release/tarn}
N=${N:-20000}
ROUNDS=${ROUNDS:-2}
[ "$(id -u)" = 0 ] || { echo "fs_bigdir.sh: needs root (loop device, mount)" >&2; exit 1; }
[ -x "$TARN_NEW" ] || { echo "fs_bigdir.sh: $TARN_NEW not built (cargo build --release -p tarn-cli)" >&2; exit 1; }
TARN=$TARN_NEW
. "$REPO/bench/fs_common.sh"
fs_bench_setup fsbigdir
LOOP=
trap 'mountpoint -q "$MNT" && umount "$MNT"; [ -n "$LOOP" ] && losetup -d "$LOOP"; fs_bench_cleanup' EXIT
OUT=$REPO/bench/results/$(date -u +%Y-%m-%d-%H%M%S)-fs_bigdir.txt

# The workload on the mounted MNT: "q1 q2 q3 q4 unlink" in ms.
workload() {
  python3 - "$MNT/dir" "$N" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(d)
marks, t = [], time.monotonic()
for i in range(n):
    os.close(os.open(f"{d}/file-{i:07d}", os.O_CREAT | os.O_WRONLY, 0o644))
    if (i + 1) % (n // 4) == 0:
        marks.append(time.monotonic() - t)
t2 = time.monotonic()
for i in range(n):
    os.unlink(f"{d}/file-{i:07d}")
u = time.monotonic() - t2
q = [b - a for a, b in zip([0] + marks, marks)]
print(" ".join(str(int(x * 1000)) for x in q + [u]))
PY
}

# one CONFIG: a fresh file system, the workload; prints its line
one() {
  rm -f "$POOL"
  case $1 in
    ext4raw)
      truncate -s 8G "$POOL"
      mkfs.ext4 -q -F "$POOL"
      LOOP=$(losetup -f --show "$POOL")
      mount "$LOOP" "$MNT"
      workload
      umount "$MNT"
      losetup -d "$LOOP"
      LOOP=
      ;;
    tarnfs | tarnfsbase)
      TARN=$TARN_NEW
      [ "$1" = tarnfsbase ] && TARN=$TARN_BASE
      "$TARN" pool create "$POOL" --size 8G >/dev/null
      "$TARN" fs create home -p "$POOL" >/dev/null
      mount_fs
      workload
      umount_fs
      ;;
  esac
}

CONFIGS="ext4raw tarnfs${TARN_BASE:+ tarnfsbase}"
{
  echo "# bench/fs_bigdir.sh N=$N ROUNDS=$ROUNDS $(date -u +%FT%TZ) ($(uname -r), $(nproc) cpus, git $(git -C "$REPO" rev-parse --short HEAD))${TARN_BASE:+ TARN_BASE=$TARN_BASE}"
  echo "# per config: create ms in each quarter of N, then unlink ms of all N"
  declare -A C U
  for r in $(seq 1 "$ROUNDS"); do
    order=$CONFIGS
    [ $((r % 2)) = 0 ] && order=$(echo "$CONFIGS" | tr ' ' '\n' | tac | tr '\n' ' ')
    for c in $order; do
      read -r q1 q2 q3 q4 u < <(one "$c")
      echo "round $r $c: create quarters $q1 $q2 $q3 $q4 ms (total $((q1 + q2 + q3 + q4))), unlink $u ms"
      C[$c]="${C[$c]:-} $((q1 + q2 + q3 + q4))"
      U[$c]="${U[$c]:-} $u"
    done
  done
  med() { echo "$1" | tr ' ' '\n' | grep . | median; }
  base_c=$(med "${C[ext4raw]}")
  base_u=$(med "${U[ext4raw]}")
  for c in $CONFIGS; do
    mc=$(med "${C[$c]}")
    mu=$(med "${U[$c]}")
    echo "$c: create $mc ms ($(awk -v a="$mc" -v b="$base_c" 'BEGIN { printf "%.2fx", a / b }') ext4raw), unlink $mu ms ($(awk -v a="$mu" -v b="$base_u" 'BEGIN { printf "%.2fx", a / b }') ext4raw); rounds: create${C[$c]}, unlink${U[$c]}"
  done
} | tee "$OUT"
echo "results: $OUT"

#!/usr/bin/env bash
# The file cache's readahead (issue 15 item 6b; docs/ARCHITECTURE.md
# *File cache*): the cold sequential read of a FILE_MB (1024) MiB file
#   seq   written sequentially (dd, 1 MiB writes)
#   rand  written by 4 KiB O_DIRECT random writes (fio, each block once, in
#         random order: each a FUSE WRITE of its own, so on tarn its blocks
#         land scattered in the pool, as on ext4 they do not)
# on three targets: `on` a tarn mount with the default file cache, `off`
# the same pool mounted with `--readahead 0`, `ext4` ext4 on a loop device
# over a plain sparse file (written the same way). Both files are written
# once per target; each round then reads them cold (the whole page cache
# dropped before each read), targets in alternating order. Prints MiB/s
# per round and read, the median [min-max], and per round the ratios
# on/off and on/ext4. Needs root, fio.
#   TARN (target/release/tarn)  DIR (/var/tmp/tarn-ra)  ROUNDS (3)
#   FILE_MB (1024)  ON_ARGS / OFF_ARGS: more `tarn mount` arguments
#   TARN_OFF: the binary of the `off` target (default TARN)
#   TARGETS ("on off ext4"): more tarn targets NAME may be listed, mounted
#   with $NAME_ARGS (upper case) and the environment $NAME_ENV (an A/B of
#   two variants in one run); ratios are on/off and on/ext4
set -euo pipefail
cd "$(dirname "$0")/.."
TARN=${TARN:-$PWD/target/release/tarn}
TARN_OFF=${TARN_OFF:-$TARN}
DIR=${DIR:-/var/tmp/tarn-ra}
ROUNDS=${ROUNDS:-3}
FILE_MB=${FILE_MB:-1024}
ON_ARGS=${ON_ARGS:-}
OFF_ARGS=${OFF_ARGS:---readahead 0}
SIZE=$((FILE_MB * 3 + 1024))M
OUT=bench/results/$(date -u +%Y-%m-%d-%H%M%S)-fs-readahead.txt
POOL=$DIR/pool.img MNT=$DIR/tarn EXT=$DIR/ext4 LOOP= MOUNT_PID=

cleanup() {
  set +e
  tarn_down
  mountpoint -q "$EXT" && umount "$EXT"
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  rm -rf "$DIR"
}
trap cleanup EXIT

wait_mounted() {
  for _ in $(seq 1 100); do mountpoint -q "$MNT" && return 0; sleep 0.1; done
  echo "fs_readahead.sh: the mount did not come up" >&2; cat "$DIR/mount.log" >&2; exit 1
}

tarn_up() { # [VAR=VALUE...] BINARY [ARGS...]: mount the pool on $MNT
  local vars=()
  while [[ $1 == *=* ]]; do vars+=("$1"); shift; done
  local bin=$1; shift
  env RUST_LOG=tarn_fs=info "${vars[@]}" "$bin" mount home "$MNT" -p "$POOL" --no-discard "$@" >"$DIR/mount.log" 2>&1 &
  MOUNT_PID=$!
  wait_mounted
}

tarn_down() {
  [ -z "$MOUNT_PID" ] && return 0
  fusermount3 -u "$MNT"; wait "$MOUNT_PID"; MOUNT_PID=
}

write_files() { # DIR: seq and rand, FILE_MB MiB each, durable
  dd if=/dev/urandom of="$1/seq" bs=1M count="$FILE_MB" conv=fsync status=none
  fio --name=rand --filename="$1/rand" --rw=randwrite --bs=4k --direct=1 \
    --size="${FILE_MB}M" --ioengine=psync --randrepeat=1 --end_fsync=1 \
    --fallocate=none --output=/dev/null
}

cold_read() { # FILE: MiB/s of one cold sequential read
  sync; echo 3 >/proc/sys/vm/drop_caches
  local t0 t1
  t0=$(date +%s.%N)
  dd if="$1" of=/dev/null bs=1M status=none
  t1=$(date +%s.%N)
  awk -v mb="$FILE_MB" -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", mb / (b - a) }'
}

read_target() { # TARGET: "seq rand" MiB/s
  local d=$MNT args env
  args=${1^^}_ARGS env=${1^^}_ENV
  case $1 in
    off) tarn_up "$TARN_OFF" $OFF_ARGS ;;
    ext4) d=$EXT ;;
    # shellcheck disable=SC2086 # NAME_ENV, NAME_ARGS: words
    *) tarn_up ${!env:-} "$TARN" ${!args:-} ;;
  esac
  local s r
  s=$(cold_read "$d/seq"); r=$(cold_read "$d/rand")
  [ "$1" = ext4 ] || tarn_down
  echo "$s $r"
}

rm -rf "$DIR"; mkdir -p "$DIR" "$MNT" "$EXT"
"$TARN" pool create "$POOL" --size "$SIZE" >/dev/null
"$TARN" fs create home -p "$POOL" >/dev/null
tarn_up "$TARN"; write_files "$MNT"; tarn_down
truncate -s "$SIZE" "$DIR/raw.img"
LOOP=$(losetup -f --show "$DIR/raw.img")
mkfs.ext4 -q -F -b 4096 "$LOOP"; mount "$LOOP" "$EXT"
write_files "$EXT"

declare -A SEQ RAND
read -r -a LIST <<<"${TARGETS:-on off ext4}"
{
  echo "# bench/fs_readahead.sh $(date -u +%FT%TZ) FILE_MB=$FILE_MB ROUNDS=$ROUNDS ON_ARGS='$ON_ARGS' OFF_ARGS='$OFF_ARGS'"
  echo "# tarn $($TARN --version 2>/dev/null || echo ?); load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "round target seq_MiBs rand_MiBs"
} | tee "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  ORDER=("${LIST[@]}")
  if [ $((r % 2)) = 0 ]; then
    ORDER=(); for ((i = ${#LIST[@]} - 1; i >= 0; i--)); do ORDER+=("${LIST[$i]}"); done
  fi
  for t in "${ORDER[@]}"; do
    read -r s q < <(read_target "$t")
    SEQ[$r.$t]=$s RAND[$r.$t]=$q
    echo "$r $t $s $q $(grep -o 'readahead: .*dropped' "$DIR/mount.log" 2>/dev/null || true)" | tee -a "$OUT"
  done
  echo "# round $r ratios: seq on/off $(awk -v a="${SEQ[$r.on]}" -v b="${SEQ[$r.off]}" 'BEGIN{printf "%.2f", a/b}') on/ext4 $(awk -v a="${SEQ[$r.on]}" -v b="${SEQ[$r.ext4]}" 'BEGIN{printf "%.2f", a/b}'); rand on/off $(awk -v a="${RAND[$r.on]}" -v b="${RAND[$r.off]}" 'BEGIN{printf "%.2f", a/b}') on/ext4 $(awk -v a="${RAND[$r.on]}" -v b="${RAND[$r.ext4]}" 'BEGIN{printf "%.2f", a/b}'); load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT"
done
med() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { printf "%d [%d-%d]", a[int((NR + 1) / 2)], a[1], a[NR] }'; }
for t in "${LIST[@]}"; do
  s= q=
  for r in $(seq 1 "$ROUNDS"); do s="$s ${SEQ[$r.$t]}" q="$q ${RAND[$r.$t]}"; done
  echo "# $t: seq $(echo "$s" | med) MiB/s, rand $(echo "$q" | med) MiB/s (median [min-max])" | tee -a "$OUT"
done
echo "written to $OUT"

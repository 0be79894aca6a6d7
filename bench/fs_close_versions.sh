#!/usr/bin/env bash
# Open-close versioning figures on a real FUSE mount (issue 15 targets):
#   1. time of a close: one edit (dd: open, write 4 KiB, close) of a
#      versioned `*.c` file against the same edit of an unversioned
#      `*.o` file, alternating rounds, medians and their ratio;
#   2. `ls f.c@` with EDITS close versions (5 runs, ms);
#   3. space per close version: pool `used` growth over EDITS edits of
#      each file (one 4 KiB block each), the versioned file's minus the
#      unversioned one's, per version (target: < 200 bytes of metadata).
# keep is set to 1024 so no version is pruned during a run (EDITS < 1024).
#   bash bench/fs_close_versions.sh          # EDITS=500
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
EDITS=${EDITS:-500}
. "$REPO/bench/fs_common.sh"
fs_bench_setup fcv
# edit FILE I: overwrite block I (of 256) of FILE; prints microseconds
edit() {
  local t0 t1
  t0=$(now)
  dd if="$W/block" of="$MNT/$1" bs=4096 count=1 seek=$(($2 % 256)) conv=notrunc status=none
  t1=$(now)
  echo $(((t1 - t0) / 1000))
}

"$TARN" pool create "$POOL" --size 8G >/dev/null
"$TARN" fs create home -p "$POOL" >/dev/null
"$TARN" fs version-policy home add '*.c' -p "$POOL" >/dev/null
"$TARN" fs version-policy home keep 1024 -p "$POOL" >/dev/null
dd if=/dev/urandom of="$W/block" bs=4096 count=1 status=none
mount_fs
dd if=/dev/urandom of="$MNT/f.c" bs=1M count=1 status=none
dd if=/dev/urandom of="$MNT/f.o" bs=1M count=1 status=none
# g.c: the space run's versioned file (versions of its own: none pruned).
dd if=/dev/urandom of="$MNT/g.c" bs=1M count=1 status=none
umount_fs

# Time: alternating rounds, each edit of f.c then of f.o.
mount_fs
: >"$W/c.us"
: >"$W/o.us"
for i in $(seq 1 "$EDITS"); do
  edit f.c "$i" >>"$W/c.us"
  edit f.o "$i" >>"$W/o.us"
done
VERSIONS=$(ls "$MNT/f.c@" | wc -l)
LS=()
for r in 1 2 3 4 5; do
  a=$(now)
  ls "$MNT/f.c@" >/dev/null
  b=$(now)
  LS+=($(((b - a) / 1000000)))
done
umount_fs
C_US=$(median <"$W/c.us")
O_US=$(median <"$W/o.us")

# Space: each file's edits alone, used before and after.
U0=$(used) M0=$(meta)
mount_fs
for i in $(seq 1 "$EDITS"); do dd if=/dev/urandom of="$MNT/f.o" bs=4096 count=1 seek=$((i % 256)) conv=notrunc status=none; done
umount_fs
U1=$(used) M1=$(meta)
mount_fs
for i in $(seq 1 "$EDITS"); do dd if=/dev/urandom of="$MNT/g.c" bs=4096 count=1 seek=$((i % 256)) conv=notrunc status=none; done
umount_fs
U2=$(used) M2=$(meta)
# The metadata store's own growth (catalog entries, map and sums nodes),
# per version beyond the unversioned edit: the part of a version that is
# neither a data block of the file nor a block of the inode table.
META=$((((M2 - M1) - (M1 - M0)) / EDITS))
PER=$((((U2 - U1) - (U1 - U0)) / EDITS))
DATA=$(((U2 - U1) / EDITS))

echo "# bench/fs_close_versions.sh (EDITS=$EDITS) $(date -u +%FT%TZ)"
echo "edit (open, 4 KiB write, close), median us: versioned f.c $C_US, unversioned f.o $O_US, ratio $(awk "BEGIN { printf \"%.2f\", $C_US / $O_US }") ($VERSIONS versions listed in f.c@ after the timed run)"
echo "ls f.c@ ($VERSIONS entries), 5 runs (ms): ${LS[*]} (target < 50)"
echo "pool used per edit: versioned $DATA bytes, unversioned $(((U1 - U0) / EDITS)) bytes; per close version beyond the unversioned edit: $PER bytes of blocks, of which 4096 the data block the version keeps and $((PER - 4096)) the version's metadata blocks (its 64-byte record in the version log and its share of the log's blocks; a table snapshot version pinned a 4 KiB table block); metadata store per version: $META bytes (pool status .metadata: the object tag's catalog entry, with its dead list inline since INLINE_DEAD_LISTS, before that a 4 KiB dead-list node); metadata in all: $((PER - 4096 + META)) bytes (target < 200)"

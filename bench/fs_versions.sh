#!/usr/bin/env bash
# Loris versioning figures on a real FUSE mount (issue 15 targets):
#   1. volume snapshot creation (setfattr user.tarn.snapshot on the
#      mount: header bump + one engine snapshot + one commit) with 100
#      and with 10,000 files in the volume; median of ROUNDS each;
#   2. `ls foo@` with VERSIONS versions (foo changed between snapshots),
#      first listing after the last snapshot and warm ones;
#      against two baselines on the same mount: a refused setfattr (the
#      process and FUSE round trip) and a 1-byte write + fsync (a commit);
#   3. space per version: pool `used` growth over the VERSIONS versions
#      minus the data blocks they changed (one 4 KiB block each).
# Not a peer comparison (no other file system has per-file version
# directories); figures are absolute. Sequential, not alternating: the
# mount holds the pool, and a volume cannot shrink from 10,000 files.
#   bash bench/fs_versions.sh            # VERSIONS=1000 ROUNDS=20
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
VERSIONS=${VERSIONS:-1000}
ROUNDS=${ROUNDS:-20}
. "$REPO/bench/fs_common.sh"
fs_bench_setup fsv

# baseline KIND: ROUNDS of what a snapshot cannot be cheaper than, median
# in microseconds: `xattr` a setfattr the mount refuses (ENOTSUP: process
# and FUSE round trip, no commit); `commit` a 1-byte write + fsync (dd
# conv=fsync: one commit of the pool)
baseline() {
  for r in $(seq 1 "$ROUNDS"); do
    local t0 t1
    t0=$(now)
    case $1 in
      xattr) setfattr -n user.other -v x "$MNT" 2>/dev/null || true ;;
      commit) printf x | dd of="$MNT/files/f1" bs=1 count=1 conv=notrunc,fsync status=none ;;
    esac
    t1=$(now)
    echo $(((t1 - t0) / 1000))
  done | median
}

# snap_times N: ROUNDS snapshots, the median in microseconds
snap_times() {
  for r in $(seq 1 "$ROUNDS"); do
    local t0 t1
    t0=$(now)
    setfattr -n user.tarn.snapshot -v "n$1-$r" "$MNT"
    t1=$(now)
    echo $(((t1 - t0) / 1000))
  done | median
}

"$TARN" pool create "$POOL" --size 8G >/dev/null
"$TARN" fs create home -p "$POOL" >/dev/null
mount_fs
mkdir "$MNT/files"
for i in $(seq 1 100); do echo "$i" >"$MNT/files/f$i"; done
SNAP100=$(snap_times 100)
(cd "$MNT/files" && seq 101 10000 | sed 's/^/f/' | xargs touch)
sync -f "$MNT"
SNAP10K=$(snap_times 10000)
SNAP100B=$(snap_times 100b)
XATTR=$(baseline xattr)
COMMIT=$(baseline commit)
umount_fs

# Versions of one file: change one 4 KiB block, snapshot, VERSIONS times.
mount_fs
dd if=/dev/urandom of="$MNT/foo" bs=4096 count=1 status=none
sync -f "$MNT"
umount_fs
U0=$(used)
mount_fs
t0=$(now)
for v in $(seq 1 "$VERSIONS"); do
  dd if=/dev/urandom of="$MNT/foo" bs=4096 count=1 conv=notrunc status=none
  setfattr -n user.tarn.snapshot -v "v$v" "$MNT"
done
t1=$(now)
LS=()
for r in 1 2 3 4 5; do
  a=$(now)
  n=$(ls "$MNT/foo@" | wc -l)
  b=$(now)
  LS+=($(((b - a) / 1000000)))
done
umount_fs
U1=$(used)
META=$(((U1 - U0 - VERSIONS * 4096) / VERSIONS))

echo "# bench/fs_versions.sh (VERSIONS=$VERSIONS ROUNDS=$ROUNDS) $(date -u +%FT%TZ)"
echo "snapshot creation, median of $ROUNDS (us): 100 files $SNAP100 (the first includes the feature commits), 10000 files $SNAP10K then again $SNAP100B (target <= 5000, flat)"
echo "baselines, median of $ROUNDS (us): refused setfattr (no commit) $XATTR, 1-byte write + fsync (one commit) $COMMIT"
echo "$VERSIONS versions made in $(((t1 - t0) / 1000000)) ms (dd + setfattr each)"
echo "ls foo@ ($n entries), 5 runs (ms): ${LS[*]} (target < 50)"
echo "pool used per version beyond its 4 KiB data block: $META bytes (target < 200)"

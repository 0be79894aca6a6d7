#!/usr/bin/env bash
# ext4 on a volume of each placement policy (append, inplace, contiguous),
# through nbdfuse + loop: files written and checksummed, a snapshot, files
# rewritten after it (copy-on-write), then `tarn pool compact` of the volume
# while ext4 is mounted. Compaction must keep the snapshot's usage
# (sharing kept), and both the head and the snapshot must pass e2fsck -fn
# with every file as written; the pool check stays clean.
. "$(dirname "$0")/lib.sh"
need fsfreeze nbdfuse fusermount3 losetup mkfs.ext4 e2fsck sha256sum mountpoint jq
need_root "losetup, mount"
need_fuse
need_loop
e2e_init ext4_policies

M=$((1 << 20))
SIZE=$((512 * M))
POOL=$T/pool.img
POLICIES="append inplace contiguous"
make_pool "$POOL" 3G
for p in $POLICIES; do
  out=$(tarn vol create "e_$p" --size $SIZE --placement "$p" -p "$POOL" 2>&1) || die "vol create --placement $p: $out"
done
# No idle compaction: the explicit one below is what is tested.
start_serve "$POOL" --compact-idle 0
FUSE=$T/fuse
MNT=$T/mnt
mkdir -p "$FUSE" "$MNT"

write_tree() { # DIR SEED-WORD: 3 x 8M random files, 300 small ones
  local d=$1 i
  mkdir -p "$d/small"
  for i in 1 2 3; do head -c $((8 * M)) /dev/urandom >"$d/big$i"; done
  for i in $(seq 1 300); do head -c $((RANDOM * 3 % 20000 + 1)) /dev/urandom >"$d/small/f$i"; done
}
sums() { (cd "$MNT" && find . -path ./lost+found -prune -o -type f -print0 | sort -z | xargs -0 sha256sum); }
snap_usage() { tarn snap list -p "$POOL" --json | jq -c --arg v "$1" '[.[] | select(.volume == $v) | [.exclusive, .referenced]]'; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

for p in $POLICIES; do
  V=e_$p
  step "$p: mkfs.ext4, files, a snapshot, files rewritten after it"
  fuse_attach "$V" $SIZE
  check "mkfs.ext4 ($p)" mkfs.ext4 -q -F -b 4096 "$LOOP"
  check "mount ($p)" mount -t ext4 "$LOOP" "$MNT"
  write_tree "$MNT/a"
  sync
  sums >"$T/$p.snap.sums"
  # As LVM does for a snapshot of a mounted file system: freeze it, so the
  # journal is checkpointed and the snapshot is clean for e2fsck -fn (a
  # sync alone leaves it crash-consistent: counters and bitmap checksums
  # that only a journal replay fixes).
  check "fsfreeze -f ($p)" fsfreeze -f "$MNT"
  check "snapshot $V@s1 while mounted and frozen" "$TARN" snap create "$V@s1" -p "$POOL"
  check "fsfreeze -u ($p)" fsfreeze -u "$MNT"
  # Rewrite one big file whole, patch another in place, new files, deletes.
  head -c $((8 * M)) /dev/urandom >"$MNT/a/big1"
  dd if=/dev/urandom of="$MNT/a/big2" bs=4k count=300 seek=500 conv=notrunc status=none
  write_tree "$MNT/b"
  rm -f "$MNT"/a/small/f1*
  sync
  sums >"$T/$p.head.sums"
  before=$(snap_usage "$V")

  step "$p: pool compact while mounted; the snapshot's usage is unchanged"
  out=$(tarn pool compact --volume "$V" -p "$POOL" --json 2>"$T/compact.err") ||
    bad "pool compact --volume $V: $out $(tail -2 "$T/compact.err")"
  moved=$(jq '[.volumes[] | .windows_moved] | add // 0' <<<"$out")
  # append sent every rewrite to new space: there is scattered data to move.
  if [ "$p" = append ]; then expect_between "compaction moved windows ($p)" "$moved" 1 100000
  else say "  windows moved: $moved"; fi
  expect_eq "snapshot exclusive/referenced bytes after compaction ($p)" "$(snap_usage "$V")" "$before"
  drop_caches
  check "files read back after compaction ($p)" bash -c "cd '$MNT' && sha256sum --quiet -c '$T/$p.head.sums'"
  fuse_detach
  fuse_attach "$V" $SIZE
  check "e2fsck -fn of the head ($p)" e2fsck -fn "$LOOP"
  check "remount ($p)" mount -t ext4 -o ro "$LOOP" "$MNT"
  check "files after remount ($p)" bash -c "cd '$MNT' && sha256sum --quiet -c '$T/$p.head.sums'"
  fuse_detach

  step "$p: the snapshot as it was"
  fuse_attach "$V@s1" $SIZE
  check "e2fsck -fn of the snapshot ($p)" e2fsck -fn "$LOOP"
  check "mount the snapshot read-only ($p)" mount -t ext4 -o ro,noload "$LOOP" "$MNT"
  check "snapshot files as at the snapshot ($p)" bash -c "cd '$MNT' && sha256sum --quiet -c '$T/$p.snap.sums'"
  fuse_detach
done

stop_serve
pool_check "$POOL" "after ext4 on every placement, snapshots and compaction"
e2e_finish

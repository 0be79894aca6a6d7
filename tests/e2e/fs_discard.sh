#!/usr/bin/env bash
# `tarn mount --no-discard` (issue 15, PostMark slice 3): by default the
# space of deleted data is handed back to the host by a hole punched in
# the pool file at the commit that frees it (a discard); with
# --no-discard no hole is punched (each punch cost about a millisecond
# under the namespace lock: a third of a full PostMark run), the space
# stays allocated in the pool file (as ext4 without `-o discard`) and
# tarn reuses it once its allocation cursor comes back. Checked on a real mount by the pool file's allocated
# size (stat %b): it drops after an rm with discards and does not
# without, the volume's free space comes back either way, and data
# written after it reads back, before and after a remount.
. "$(dirname "$0")/lib.sh"
need fusermount3 mountpoint sha256sum dd stat python3
need_root "mounts a FUSE file system"
need_fuse
e2e_init fs_discard

POOL=$T/pool.img
MNT=$T/mnt
mkdir -p "$MNT"
MOUNT_PID=
MIB=1048576

alloc() { echo $(($(stat -c %b "$POOL") * 512)); }
free_blocks() { stat -f -c %a "$MNT"; }
freed() { [ "$(free_blocks)" -ge "$1" ]; }
fsync() { python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)' "$1"; }

# round LABEL [mount args]: write 32 MiB, fsync, rm, unmount; prints
# nothing, sets BEFORE and AFTER (pool file allocated bytes)
round() {
  local L=$1 free0 s
  fs_mount home "${@:2}"
  free0=$(free_blocks)
  check "$L: 32 MiB file" dd if=/dev/urandom of="$MNT/big" bs=1M count=32 status=none
  check "$L: fsync it (a commit)" fsync "$MNT/big"
  BEFORE=$(alloc)
  check "$L: rm it" rm "$MNT/big"
  # (less 1 MiB: the metadata written meanwhile)
  check "$L: its space comes back to the volume" wait_until 30 freed $((free0 - 256))
  fs_umount
  AFTER=$(alloc)
  echo "    $L: pool file allocated $((BEFORE / MIB)) MiB before the rm, $((AFTER / MIB)) MiB after the unmount"
}

make_pool "$POOL" 1G
check "tarn fs create home" tarn fs create home -p "$POOL"

step "default (discard): the rm punches the file's space out of the pool file"
round discard
check "discard: the pool file shrank by 24 MiB or more" test $((BEFORE - AFTER)) -ge $((24 * MIB))
fs_clean "after the discard round"

step "--no-discard: the space stays allocated in the pool file and is reused"
round no-discard --no-discard
check "no-discard: the pool file did not shrink by 4 MiB or more" test $((BEFORE - AFTER)) -lt $((4 * MIB))
fs_clean "after the no-discard round"
KEPT=$AFTER

step "--no-discard: data written into the reused space reads back"
fs_mount home --no-discard
check "reuse: 32 MiB file" dd if=/dev/urandom of="$T/src" bs=1M count=32 status=none
check "reuse: copied onto the mount" cp "$T/src" "$MNT/again"
check "reuse: fsync it" fsync "$MNT/again"
expect_eq "reuse: reads back" "$(sha256sum <"$MNT/again" | cut -c1-64)" "$(sha256sum <"$T/src" | cut -c1-64)"
fs_umount
# The allocator's cursor goes on past the freed space before it comes
# back to it: the pool file grows to its high-water mark (as a loop
# device's image under ext4 without discard).
echo "    reuse: pool file allocated $(($(alloc) / MIB)) MiB (was $((KEPT / MIB)) MiB)"
fs_mount home
expect_eq "reuse: reads back after a remount" "$(sha256sum <"$MNT/again" | cut -c1-64)" "$(sha256sum <"$T/src" | cut -c1-64)"
fs_umount
fs_clean "after the reuse round"

e2e_finish

#!/usr/bin/env bash
# What the kernel caches of a tarn file volume is never stale (issue 15,
# PostMark slice): names and attributes of live files are cached 30 s,
# every file's pages are kept across opens, and without a close-version
# policy the mount answers OPEN with ENOSYS (the kernel then sends no
# OPEN or RELEASE). Every change goes through the mount, so each read
# below must see it at once: overwrite in place, append, truncate,
# rename over a name, unlink (and a file unlinked while open stays
# readable, its space freed only after the kernel forgets it), a
# snapshot then a change (the version keeps the old data, the file
# shows the new), and a write into a version (refused; the version's
# cached pages still show the version). Run twice: without a policy (no
# OPEN) and with one (`*.c`: OPEN and RELEASE seen).
. "$(dirname "$0")/lib.sh"
need fusermount3 mountpoint sha256sum dd setfattr stat truncate
need_root "mounts a FUSE file system"
need_fuse
e2e_init fs_cache

POOL=$T/pool.img
MNT=$T/mnt
mkdir -p "$MNT"
MOUNT_PID=

sum() { sha256sum "$1" | cut -c1-64; }
free_blocks() { stat -f -c %a "$MNT"; }
# freed AT_LEAST: the mount reports at least AT_LEAST free blocks
freed() { [ "$(free_blocks)" -ge "$1" ]; }

# cache_checks LABEL: every staleness check on the mounted volume
cache_checks() {
  local L=$1 d=$MNT/$1 s0 s1 free0 free1
  mkdir -p "$d"
  step "$L: overwrite, append and truncate read back at once"
  check "$L: f: 1 MiB" dd if=/dev/urandom of="$d/f" bs=64K count=16 status=none
  s0=$(sum "$d/f")
  check "$L: overwrite its first 4 KiB in place" dd if=/dev/urandom of="$d/f" bs=4K count=1 conv=notrunc status=none
  s1=$(sum "$d/f")
  check_fails "$L: the overwrite shows at once" test "$s0" = "$s1"
  printf 'tail' >>"$d/f"
  expect_eq "$L: append: size" "$(stat -c %s "$d/f")" $((1048576 + 4))
  expect_eq "$L: append: the last bytes" "$(tail -c 4 "$d/f")" tail
  check "$L: truncate to 5000" truncate -s 5000 "$d/f"
  expect_eq "$L: truncate: size" "$(stat -c %s "$d/f")" 5000
  expect_eq "$L: truncate: bytes read" "$(wc -c <"$d/f")" 5000
  check "$L: truncate to 0" truncate -s 0 "$d/f"
  expect_eq "$L: truncate to 0: nothing read" "$(wc -c <"$d/f")" 0

  step "$L: rename over a name, unlink"
  echo old >"$d/b"
  expect_eq "$L: b read once (cached)" "$(cat "$d/b")" old
  echo new >"$d/a"
  check "$L: mv a over b" mv "$d/a" "$d/b"
  expect_eq "$L: b is a's data" "$(cat "$d/b")" new
  check_fails "$L: a is gone" test -e "$d/a"
  check "$L: rm b" rm "$d/b"
  check_fails "$L: b is gone" test -e "$d/b"

  step "$L: a file unlinked while open stays readable; its space comes back after"
  check "$L: big: 32 MiB" dd if=/dev/urandom of="$d/big" bs=1M count=32 status=none
  s0=$(sum "$d/big")
  sync -f "$MNT"
  free0=$(free_blocks)
  exec 7<"$d/big"
  check "$L: rm big while open" rm "$d/big"
  expect_eq "$L: the open file reads its data" "$(sha256sum <&7 | cut -c1-64)" "$s0"
  exec 7<&-
  # Freed space counts once committed (every 5 s; `sync -f` is not
  # passed to a FUSE server): wait for that commit, then check.
  wait_until 20 freed $((free0 + 32 * 256)) || true
  free1=$(free_blocks)
  expect_eq "$L: 32 MiB free again after the close (free blocks $free0 -> $free1)" "$((free1 >= free0 + 32 * 256))" 1

  step "$L: snapshot, then change: the version keeps the old data"
  check "$L: v: 256 KiB" dd if=/dev/urandom of="$d/v" bs=64K count=4 status=none
  s0=$(sum "$d/v")
  check "$L: snapshot $L by setfattr" setfattr -n user.tarn.snapshot -v "$L" "$MNT"
  local n; n=$(ls "$d/v@" | sort -n | tail -n 1)
  expect_eq "$L: v@$n read once (cached)" "$(sum "$d/v@$n")" "$s0"
  check "$L: overwrite v in place" dd if=/dev/urandom of="$d/v" bs=4K count=1 conv=notrunc status=none
  s1=$(sum "$d/v")
  check_fails "$L: v shows the change" test "$s0" = "$s1"
  expect_eq "$L: v@$n still the old data" "$(sum "$d/v@$n")" "$s0"
  expect_eq "$L: $L@$n/v the old data" "$(sum "$MNT/$L@$n/v")" "$s0"
  # Refused at open with OPEN requests (EROFS), else at the write back
  # of close (EIO: dd checks its close).
  check_fails "$L: append into v@$n fails" bash -c "printf junk | dd of='$d/v@$n' oflag=append conv=notrunc status=none"
  expect_eq "$L: v@$n still the old data after the refused write" "$(sum "$d/v@$n")" "$s0"
  expect_eq "$L: v@$n still 256 KiB" "$(stat -c %s "$d/v@$n")" 262144
}

step "a volume without a close-version policy (no OPEN requests)"
make_pool "$POOL" 2G
check "tarn fs create home" tarn fs create home -p "$POOL"
fs_mount home
cache_checks noopen
fs_umount
fs_clean "after the checks without a policy"

step "with a close-version policy (*.c: OPEN and RELEASE seen)"
check "version-policy add *.c" tarn fs version-policy home add '*.c' -p "$POOL"
fs_mount home
cache_checks policy
fs_umount
fs_clean "after the checks with a policy"

e2e_finish

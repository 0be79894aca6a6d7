#!/usr/bin/env bash
# Loris versioning on file volumes (issue 15), first part: volume
# snapshots by epoch. `tarn fs snap create/list/delete`, a snapshot
# mounted read-only with `tarn mount NAME@SNAP` (real FUSE) and read with
# real tools (sha256sum, diff -r, cp -a); a deleted file found in an older
# snapshot; EROFS for writes and renames; deleting a snapshot frees what
# only it held (pool figures) and nothing the other one still reads;
# version directories on the live mount (foo@, foo@N, dir@N) with
# snapshots taken by setfattr from a script; pool check and fs check
# clean throughout; bad names.
. "$(dirname "$0")/lib.sh"
need fusermount3 mountpoint diff sha256sum dd jq setfattr
need_root "mounts a FUSE file system"
need_fuse
e2e_init fs_versions

MIB=$((1 << 20))
POOL=$T/pool.img
MNT=$T/mnt
mkdir -p "$MNT"
MOUNT_PID=



pool_free() { tarn pool status --json -p "$POOL" | jq .free; }
objects() { tarn fs list --json -p "$POOL" | jq '.[0].objects'; }
sum() { sha256sum "$1" | cut -c1-64; }

step "state 1: a tree, then snapshot one"
make_pool "$POOL" 4G
check "tarn fs create home" tarn fs create home -p "$POOL"
fs_mount home
check "doc: 3 MiB of random data" dd if=/dev/urandom of="$MNT/doc" bs=1M count=3 status=none
mkdir -p "$MNT/d"
check "d/victim: 2 MiB" dd if=/dev/urandom of="$MNT/d/victim" bs=1M count=2 status=none
echo keep >"$MNT/d/keep"
check "cp -a crates/fs into the mount" cp -a "$REPO/crates/fs" "$MNT/src"
S1_DOC=$(sum "$MNT/doc"); S1_VICTIM=$(sum "$MNT/d/victim")
fs_umount
check "tarn fs snap create home one" tarn fs snap create home one -p "$POOL"
check_fails "a second snapshot named one" tarn fs snap create home one -p "$POOL"
fs_clean "after snapshot one"

step "state 2: overwrite 1 MiB, delete a file, add one; snapshot two"
fs_mount home
check "doc: overwrite its first MiB" dd if=/dev/urandom of="$MNT/doc" bs=1M count=1 conv=notrunc status=none
check "rm d/victim" rm "$MNT/d/victim"
echo new >"$MNT/new"
S2_DOC=$(sum "$MNT/doc")
fs_umount
check "tarn fs snap create home two" tarn fs snap create home two -p "$POOL"

step "state 3: overwrite the same MiB again (the head)"
fs_mount home
check "doc: overwrite its first MiB again" dd if=/dev/urandom of="$MNT/doc" bs=1M count=1 conv=notrunc status=none
S3_DOC=$(sum "$MNT/doc")
fs_umount
expect_eq "snap list: names and numbers" "$(tarn fs snap list home --json -p "$POOL" | jq -c '[.[] | [.name, .number]]')" '[["one",1],["two",2]]'
fs_clean "after three states"

step "snapshot one, mounted read-only: state 1 exactly"
fs_mount home@one
expect_eq "doc as in state 1" "$(sum "$MNT/doc")" "$S1_DOC"
expect_eq "deleted d/victim is in snapshot one" "$(sum "$MNT/d/victim")" "$S1_VICTIM"
check "diff -r src equal to crates/fs" diff -r "$REPO/crates/fs" "$MNT/src"
check_fails "new (made later) is not in snapshot one" test -e "$MNT/new"
check "cp -a out of the snapshot" cp -a "$MNT/d" "$T/restored"
expect_eq "restored victim" "$(sum "$T/restored/victim")" "$S1_VICTIM"
check_fails "write into the snapshot" bash -c "echo x >'$MNT/doc'"
expect_eq "the error is EROFS" "$(printf '%s' "$LAST_OUT" | grep -c 'Read-only file system')" 1
check_fails "create in the snapshot" touch "$MNT/d/other"
check_fails "rename inside the snapshot" mv "$MNT/d/keep" "$MNT/d/kept"
check_fails "rm in the snapshot" rm "$MNT/d/keep"
fs_umount

step "snapshot two: state 2"
fs_mount home@two
expect_eq "doc as in state 2" "$(sum "$MNT/doc")" "$S2_DOC"
check_fails "d/victim is gone in snapshot two" test -e "$MNT/d/victim"
expect_eq "new is in snapshot two" "$(cat "$MNT/new")" new
fs_umount
fs_mount home
expect_eq "the head is state 3" "$(sum "$MNT/doc")" "$S3_DOC"
check_fails "d/victim is gone in the head" test -e "$MNT/d/victim"
fs_umount

step "delete two: frees state 2's MiB only; one still reads"
LIVE_OBJECTS=$(objects)
FREE0=$(pool_free)
check "tarn fs snap delete home two" tarn fs snap delete home two -p "$POOL"
FREED=$(( $(pool_free) - FREE0 ))
say "  freed $(mib "$FREED")"
expect_between "freed by two: 1 MiB of data + at most 64 KiB of tables and directories (KiB)" $((FREED >> 10)) 1024 1088
expect_eq "objects unchanged (victim still seen by one)" "$(objects)" "$LIVE_OBJECTS"
fs_mount home@one
expect_eq "doc still as in state 1" "$(sum "$MNT/doc")" "$S1_DOC"
expect_eq "victim still in one" "$(sum "$MNT/d/victim")" "$S1_VICTIM"
fs_umount
fs_clean "after deleting two"

step "delete one: frees state 1's MiB and the deleted file"
FREE0=$(pool_free)
check "tarn fs snap delete home one" tarn fs snap delete home one -p "$POOL"
FREED=$(( $(pool_free) - FREE0 ))
say "  freed $(mib "$FREED")"
expect_between "freed by one: 3 MiB of data + at most 64 KiB (KiB)" $((FREED >> 10)) 3072 3136
expect_eq "the retired object of victim is deleted" "$(objects)" $((LIVE_OBJECTS - 1))
expect_eq "snap list empty" "$(tarn fs snap list home --json -p "$POOL" | jq length)" 0
fs_mount home
expect_eq "the head is still state 3" "$(sum "$MNT/doc")" "$S3_DOC"
fs_umount
fs_clean "after deleting one"

step "version directories on the live mount: foo@, foo@N, dir@N"
fs_mount home
V=$MNT/v
mkdir -p "$V"
echo "a real file" >"$V/real@1"
# The kernel keeps the entry create made: drop it so that opening real@1
# later asks tarn (the escape rule is tarn's lookup, not the cache's).
drop_dentries() { sync; echo 2 >/proc/sys/vm/drop_caches; }
declare -a SUMS
for k in 1 2 3 4 5; do
  check "edit $k of v/foo" dd if=/dev/urandom of="$V/foo" bs=64K count=$k status=none
  SUMS[$k]=$(sum "$V/foo")
  [ $k = 2 ] && echo doomed >"$V/doomed"
  check "snapshot s$k by setfattr on the root" setfattr -n user.tarn.snapshot -v "s$k" "$MNT"
done
rm "$V/doomed"
expect_eq "ls foo@ shows one version per snapshot" "$(ls "$V/foo@" | wc -l)" 5
NUMS=($(ls "$V/foo@" | sort -n))
ALL=ok
for k in 1 2 3 4 5; do
  [ "$(sum "$V/foo@/${NUMS[$((k - 1))]}")" = "${SUMS[$k]}" ] || ALL="version ${NUMS[$((k - 1))]} differs from state $k"
done
expect_eq "each foo@/N holds exactly state N" "$ALL" ok
expect_eq "foo@N is the same file as foo@/N" "$(sum "$V/foo@${NUMS[2]}")" "${SUMS[3]}"
check_fails "diff of the first two versions finds a difference" diff -q "$V/foo@${NUMS[0]}" "$V/foo@${NUMS[1]}"
check "diff of one version with itself" diff -q "$V/foo@${NUMS[4]}" "$V/foo"
expect_eq "a version dir entry has POSIX attributes (size of state 2)" "$(stat -c %s "$V/foo@/${NUMS[1]}")" $((2 * 65536))
expect_eq "the deleted file is in v@N" "$(cat "$V@${NUMS[2]}/doomed")" doomed
check "cp -a v@N restored" cp -a "$V@${NUMS[2]}" "$T/restored-v"
expect_eq "restored tree holds the deleted file" "$(cat "$T/restored-v/doomed")" doomed
expect_eq "the snapshot is in every file's version dir (real@1@)" "$(ls "$V/real@1@" | wc -l)" 5
drop_dentries
expect_eq "escape rule: the real file real@1 wins" "$(cat "$V/real@1")" "a real file"
expect_eq "its own versions stay reachable as real@1@/N" "$(cat "$V/real@1@/${NUMS[0]}")" "a real file"
check "hard link" ln "$V/foo" "$V/hl"
expect_eq "version dir of a hard link lists the same versions" "$(ls "$V/hl@" | tr '\n' ' ')" "$(ls "$V/foo@" | tr '\n' ' ')"
check_fails "foo@999 does not exist" cat "$V/foo@999"
expect_eq "ENOENT" "$(printf '%s' "$LAST_OUT" | grep -c 'No such file or directory')" 1
check_fails "foo@0 does not exist" cat "$V/foo@0"
check_fails "write into foo@N" bash -c "echo x >'$V/foo@${NUMS[0]}'"
expect_eq "EROFS" "$(printf '%s' "$LAST_OUT" | grep -c 'Read-only file system')" 1
check_fails "create in v@N" touch "$V@${NUMS[0]}/new"
expect_eq "EROFS" "$(printf '%s' "$LAST_OUT" | grep -c 'Read-only file system')" 1
check_fails "rename into v@N" mv "$V/hl" "$V@${NUMS[0]}/hl"
expect_eq "EROFS" "$(printf '%s' "$LAST_OUT" | grep -c 'Read-only file system')" 1
check_fails "mkdir in foo@" mkdir "$V/foo@/x"
check_fails "rm in foo@" rm "$V/foo@/${NUMS[0]}"
check_fails "a snapshot name taken twice by setfattr" setfattr -n user.tarn.snapshot -v s1 "$MNT"
expect_eq "EEXIST" "$(printf '%s' "$LAST_OUT" | grep -c 'File exists')" 1
check "delete snapshot s2 by setfattr" setfattr -n user.tarn.snapshot.delete -v s2 "$MNT"
expect_eq "stable names: the others keep their numbers" "$(ls "$V/foo@" | sort -n | tr '\n' ' ')" "${NUMS[0]} ${NUMS[2]} ${NUMS[3]} ${NUMS[4]} "
expect_eq "version ${NUMS[2]} still holds state 3" "$(sum "$V/foo@/${NUMS[2]}")" "${SUMS[3]}"
step "retention: delete one version, and the two example scripts"
check "delete version ${NUMS[3]} by setfattr user.tarn.version.delete" setfattr -n user.tarn.version.delete -v "${NUMS[3]}" "$MNT"
expect_eq "foo@ lost version ${NUMS[3]} only" "$(ls "$V/foo@" | sort -n | tr '\n' ' ')" "${NUMS[0]} ${NUMS[2]} ${NUMS[4]} "
check_fails "delete of a version that does not exist" setfattr -n user.tarn.version.delete -v 999 "$MNT"
expect_eq "ENOENT" "$(printf '%s' "$LAST_OUT" | grep -c 'No such file or directory')" 1
check_fails "a version that is not a number" setfattr -n user.tarn.version.delete -v 3x "$MNT"
expect_eq "EINVAL" "$(printf '%s' "$LAST_OUT" | grep -c 'Invalid argument')" 1
expect_eq "the remaining versions keep their states" "$(sum "$V/foo@/${NUMS[4]}")" "${SUMS[5]}"
# Four more versions: states 6..9, state 7 differing from 6 in one byte.
for k in 6 7 8 9; do
  case $k in
    7) printf 'Z' | dd of="$V/foo" bs=1 seek=100 conv=notrunc status=none ;;
    *) dd if=/dev/urandom of="$V/foo" bs=64K count=$k status=none ;;
  esac
  SUMS[$k]=$(sum "$V/foo")
  setfattr -n user.tarn.snapshot -v "t$k" "$MNT"
done
mapfile -t NUMS < <(ls "$V/foo@" | sort -n)
expect_eq "7 versions before the scripts" "${#NUMS[@]}" 7
OUT=$(bash "$REPO/examples/retention/drop_least_changed.sh" "$MNT" "$V/foo" 1 2>&1) || bad "drop_least_changed.sh failed: $OUT"
expect_eq "drop_least_changed.sh dropped state 7 (one byte from state 6)" "$(printf '%s' "$OUT" | grep -o 'deleted version [0-9]*')" "deleted version ${NUMS[4]}"
check "keep_last.sh 3" bash "$REPO/examples/retention/keep_last.sh" "$MNT" "$V/foo" 3
expect_eq "three versions left: states 6, 8, 9" "$(for n in $(ls "$V/foo@" | sort -n); do sum "$V/foo@/$n"; done | tr '\n' ' ')" "${SUMS[6]} ${SUMS[8]} ${SUMS[9]} "
check_fails "keep_last.sh of a file with no version dir" bash "$REPO/examples/retention/keep_last.sh" "$MNT" "$T/nowhere" 1
fs_umount
fs_clean "after version directories and retention"

# A snapshot taken from the mount is a namespace change: durable with the
# next commit (an fsync after it, `sync MOUNT`, the timed one), never
# without the changes before it. The mount gets a long commit interval so
# that only the fsync and the sync commit here.
step "snapshots from the mount: durable with the next commit"
fs_mount home --commit-interval 3600
check "snapshot d1 by setfattr" setfattr -n user.tarn.snapshot -v d1 "$MNT"
check "a file written with fsync after it" dd if=/dev/urandom of="$MNT/after_d1" bs=64k count=4 conv=fsync status=none
SUM_D1=$(sum "$MNT/after_d1")
kill9_mount
fs_clean "after kill -9 with d1 and an fsync after it"
expect_eq "d1 kept: the fsync after it committed it" "$(tarn fs snap list home --json -p "$POOL" | jq -r '.[].name' | grep -c '^d1$')" 1
fs_mount home --commit-interval 3600
expect_eq "the fsync'd file kept" "$(sum "$MNT/after_d1")" "$SUM_D1"
check "snapshot d2 by setfattr" setfattr -n user.tarn.snapshot -v d2 "$MNT"
check "delete d1 by setfattr" setfattr -n user.tarn.snapshot.delete -v d1 "$MNT"
check "sync MOUNT" sync "$MNT"
kill9_mount
fs_clean "after kill -9 with d2, d1 deleted and sync MOUNT"
expect_eq "after sync MOUNT: d2 kept, d1 gone" "$(tarn fs snap list home --json -p "$POOL" | jq -r '.[].name' | grep -E '^d[12]$' | tr '\n' ' ')" "d2 "

step "bad input"
BEFORE=$(tarn fs snap list home --json -p "$POOL" | jq -c '[.[].name]')
check_fails "delete of an unknown snapshot" tarn fs snap delete home nosuch -p "$POOL"
expect_eq "the error names it" "$(printf '%s' "$LAST_OUT" | grep -c 'no snapshot "nosuch"')" 1
check_fails "snapshot of an unknown file volume" tarn fs snap create nosuch s -p "$POOL"
check_fails "a snapshot name with a slash" tarn fs snap create home a/b -p "$POOL"
check_fails "mount of an unknown snapshot" tarn mount home@nosuch "$MNT" -p "$POOL"
expect_eq "bad input changed no snapshot" "$(tarn fs snap list home --json -p "$POOL" | jq -c '[.[].name]')" "$BEFORE"
fs_clean "after bad input"
e2e_finish

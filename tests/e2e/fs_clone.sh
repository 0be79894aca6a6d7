#!/usr/bin/env bash
# Writable clones of a file volume snapshot (issue 15): `tarn fs clone
# FS@SNAP NEW` copies nothing (pool use grows by metadata only, not the
# 32 MiB of data), the clone mounts read-write and shows the snapshot
# (data, xattrs, a file deleted since, the version policy); changes on
# either side do not show on the other; a bad source is refused naming
# the cause; the origin cannot be destroyed (nor the snapshot deleted)
# while the clone exists; destroying the clone keeps the origin whole,
# and then both go; `tarn fs flatten` makes a clone independent (the
# shared data copied) so its origin can be destroyed under it; fs and
# pool checks clean throughout.
. "$(dirname "$0")/lib.sh"
need fusermount3 mountpoint setfattr getfattr jq sha256sum
need_root "mounts a FUSE file system"
need_fuse
e2e_init fs_clone

POOL=$T/pool.img
MNT=$T/mnt
mkdir -p "$MNT"
MOUNT_PID=
sum() { sha256sum "$1" | cut -c1-64; }
used() { tarn pool status --json -p "$POOL" | jq .used; }

step "an origin with data, xattrs and a snapshot"
make_pool "$POOL" 1G
check "tarn fs create home" tarn fs create home -p "$POOL"
check "policy *.c" tarn fs version-policy home add '*.c' -p "$POOL"
fs_mount home
mkdir "$MNT/src"
dd if=/dev/urandom of="$MNT/big" bs=1M count=32 status=none
echo 'int main;' >"$MNT/src/m.c"
echo gone >"$MNT/src/old"
setfattr -n user.k -v v1 "$MNT/big"
BIG=$(sum "$MNT/big")
check "snapshot s1" setfattr -n user.tarn.snapshot -v s1 "$MNT"
echo changed >"$MNT/src/m.c"
rm "$MNT/src/old"
fs_umount
U0=$(used)

step "clone: refused inputs change nothing, then nothing copied"
check_fails "no @SNAP" tarn fs clone home work -p "$POOL"
check_fails "no such snapshot" tarn fs clone home@nope work -p "$POOL"
expect_eq "the error names it" "$(printf '%s' "$LAST_OUT" | grep -c 'no snapshot "nope"')" 1
check_fails "no such volume" tarn fs clone nope@s1 work -p "$POOL"
check_fails "a name taken" tarn fs clone home@s1 home -p "$POOL"
expect_eq "still one file volume" "$(tarn fs list --json -p "$POOL" | jq length)" 1
check "tarn fs clone home@s1 work" tarn fs clone home@s1 work -p "$POOL"
U1=$(used)
expect_between "pool use grew by metadata only (bytes; the data is 32 MiB)" $((U1 - U0)) 0 $((1024 * 1024))
check "tarn fs check work clean" tarn fs check work -p "$POOL"
fs_clean "after clone"

step "the clone shows the snapshot and is writable, independently"
fs_mount work
expect_eq "big's data" "$(sum "$MNT/big")" "$BIG"
expect_eq "big's xattr" "$(getfattr --only-values -n user.k "$MNT/big" 2>/dev/null)" v1
expect_eq "m.c as in s1" "$(cat "$MNT/src/m.c")" 'int main;'
expect_eq "the file deleted after s1" "$(cat "$MNT/src/old")" gone
check "write into the clone" bash -c "echo clone >'$MNT/src/m.c' && dd if=/dev/zero of='$MNT/big' bs=1M count=1 conv=notrunc status=none"
check "setfattr in the clone" setfattr -n user.k -v v2 "$MNT/big"
check "new file in the clone" bash -c "echo only >'$MNT/mine'"
# (bash's `>` dups the descriptor: its first close, before the write,
# takes a version of the truncated file too)
expect_eq "the clone keeps the version policy (m.c's last close version)" "$(cat "$MNT/src/m.c@/$(ls -v "$MNT/src/m.c@" | tail -n 1)")" clone
fs_umount
fs_mount home
expect_eq "origin's big untouched" "$(sum "$MNT/big")" "$BIG"
expect_eq "origin's xattr untouched" "$(getfattr --only-values -n user.k "$MNT/big" 2>/dev/null)" v1
expect_eq "origin's m.c" "$(cat "$MNT/src/m.c")" changed
expect_eq "origin has no 'mine'" "$(ls "$MNT" | grep -c mine)" 0
check "write into the origin" bash -c "echo origin >'$MNT/src/m.c'"
fs_umount
fs_mount work
expect_eq "the clone's m.c unchanged by the origin" "$(cat "$MNT/src/m.c")" clone
fs_umount
fs_clean "after writes on both"
check "tarn fs check work clean" tarn fs check work -p "$POOL"

step "destroy: the origin is refused while cloned, the clone goes, then the origin"
check_fails "destroy home while work exists" tarn fs destroy home -p "$POOL"
expect_eq "the error names the clone" "$(printf '%s' "$LAST_OUT" | grep -c 'destroy work first')" 1
check_fails "delete snapshot s1 while cloned" tarn fs snap delete home s1 -p "$POOL"
check "tarn fs destroy work" tarn fs destroy work -p "$POOL"
fs_clean "after destroying the clone"
fs_mount home
expect_eq "origin's big after the clone went" "$(sum "$MNT/big")" "$BIG"
fs_umount
check "delete snapshot s1" tarn fs snap delete home s1 -p "$POOL"
check "tarn fs destroy home" tarn fs destroy home -p "$POOL"
pool_check "$POOL" "after destroying both"

step "flatten: a clone made independent, then its origin destroyed under it"
check "tarn fs create base" tarn fs create base -p "$POOL"
expect_eq "tarn fs flatten of a volume that is no clone says so" \
  "$(tarn fs flatten base -p "$POOL" 2>&1 | grep -c 'not a clone')" 1
fs_mount base
mkdir "$MNT/d"
dd if=/dev/urandom of="$MNT/d/data" bs=1M count=16 status=none
echo small >"$MNT/d/small"
DATA=$(sum "$MNT/d/data")
check "snapshot s1 of base" setfattr -n user.tarn.snapshot -v s1 "$MNT"
echo after >"$MNT/d/small"
fs_umount
check "clone base@s1 as copy" tarn fs clone base@s1 copy -p "$POOL"
check_fails "destroy base while copy exists" tarn fs destroy base -p "$POOL"
expect_eq "the error points to tarn fs flatten" "$(printf '%s' "$LAST_OUT" | grep -c 'tarn fs flatten copy')" 1
check_fails "flatten of an unknown file volume" tarn fs flatten nosuch -p "$POOL"
U1=$(used)
check "tarn fs flatten copy" tarn fs flatten copy -p "$POOL"
U2=$(used)
say "  pool use: $(mib "$U1") before the flatten, $(mib "$U2") after"
check "the flatten copied the 16 MiB it shared" test $((U2 - U1)) -ge $((16 << 20))
check "delete snapshot s1 of base" tarn fs snap delete base s1 -p "$POOL"
check "tarn fs destroy base" tarn fs destroy base -p "$POOL"
check "tarn fs check copy clean" tarn fs check copy -p "$POOL"
pool_check "$POOL" "after destroying the origin"
fs_mount copy
expect_eq "the clone's data after its origin went" "$(sum "$MNT/d/data")" "$DATA"
expect_eq "the clone's small file is the snapshot's" "$(cat "$MNT/d/small")" small
echo changed >"$MNT/d/small"
fs_umount
check "tarn fs flatten again: nothing to do" tarn fs flatten copy -p "$POOL"
check "tarn fs destroy copy" tarn fs destroy copy -p "$POOL"
pool_check "$POOL" "at the end"
e2e_finish

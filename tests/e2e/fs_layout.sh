#!/usr/bin/env bash
# Per-file placement and protection (issue 15 item 6a, Loris) on a real
# FUSE mount: a pool whose member 0 is a mirror (A + B) and member 1 a
# plain device (C); layout rules `*.db --mirrored` and `*.log --devices 1
# --placement append`; files written through the mount land where their
# rule says (getfattr user.tarn.layout: blocks per member), a file
# matching no rule keeps the default; setfattr user.tarn.layout sets one
# file's layout; the mirrored file reads back byte-identical with leg B
# gone; bad rules, --mirrored with no mirror, a bad value (EINVAL) and a
# stripe change after data are refused; pool and fs checks clean.
. "$(dirname "$0")/lib.sh"
need fusermount3 mountpoint setfattr getfattr sha256sum
need_root "mounts a FUSE file system"
need_fuse
e2e_init fs_layout

POOL=$T/A.img
MNT=$T/mnt
mkdir -p "$MNT"
MOUNT_PID=
# layout FILE: its user.tarn.layout value, or the error text
layout() { getfattr --absolute-names --only-values -n user.tarn.layout "$1" 2>&1; }
# blocks_on FILE MEMBER: the file's 4 KiB blocks on that member
blocks_on() { layout "$1" | sed -n "s/.*blocks=.*\b$2:\([0-9]*\).*/\1/p"; }

step "a pool with a mirrored member 0 (A + B) and a plain member 1 (C)"
check "tarn pool create A --mirror B" tarn pool create "$POOL" --mirror "$T/B.img" --size 256M
check "tarn dev add C" tarn dev add "$T/C.img" --size 256M -p "$POOL"
check "tarn fs create home" tarn fs create home -p "$POOL"

step "an empty file made before any rule (it has no data object yet)"
fs_mount home
: >"$MNT/early.db"
fs_umount

step "layout rules (offline)"
check "rule *.db --mirrored" tarn fs layout-policy home add '*.db' --mirrored -p "$POOL"
check "rule *.log --devices 1 --placement append" \
  tarn fs layout-policy home add '*.log' --devices 1 --placement append -p "$POOL"
expect_eq "rules listed in order" \
  "$(tarn fs layout-policy home list --json -p "$POOL" | jq -c '[.rules[] | [.rule, .layout]]')" \
  '[["*.db","mirrored"],["*.log","placement=append devices=1"]]'
check_fails "a rule setting nothing" tarn fs layout-policy home add '*.tmp' -p "$POOL"
printf '%s' "$LAST_OUT" | grep -q "sets nothing" && ok "the error says it sets nothing" || bad "error: $LAST_OUT"
check_fails "a bad rule (a/*.c)" tarn fs layout-policy home add 'a/*.c' --mirrored -p "$POOL"
check_fails "an unknown member (--devices 5)" tarn fs layout-policy home add '*.x' --devices 5 -p "$POOL"
printf '%s' "$LAST_OUT" | grep -q "not a member" && ok "the error names the member" || bad "error: $LAST_OUT"
check_fails "a bad placement" tarn fs layout-policy home add '*.x' --placement fast -p "$POOL"
check_fails "a stripe over more members than the pool has" tarn fs layout-policy home add '*.x' --stripe 3 -p "$POOL"
expect_eq "refusals wrote nothing" "$(tarn fs layout-policy home list --json -p "$POOL" | jq '.rules | length')" 2

step "files written through the mount land where their rule says"
fs_mount home
head -c $((3 << 20)) /dev/urandom >"$T/db.ref"
cp "$T/db.ref" "$MNT/app.db"
head -c $((2 << 20)) /dev/urandom >"$MNT/app.log"
head -c $((1 << 20)) /dev/urandom >"$MNT/notes.txt"
check "sync" sync "$MNT/app.db" "$MNT/app.log"
say "  app.db: $(layout "$MNT/app.db")"
say "  app.log: $(layout "$MNT/app.log")"
say "  notes.txt: $(layout "$MNT/notes.txt")"
expect_eq "app.db layout" "$(layout "$MNT/app.db" | sed 's/ blocks=.*//')" "mirrored devices=0"
expect_eq "app.db blocks on member 0" "$(blocks_on "$MNT/app.db" 0)" 768
expect_eq "app.db blocks on member 1" "$(blocks_on "$MNT/app.db" 1)" 0
expect_eq "app.log layout" "$(layout "$MNT/app.log" | sed 's/ blocks=.*//')" "placement=append devices=1"
expect_eq "app.log blocks on member 0" "$(blocks_on "$MNT/app.log" 0)" 0
expect_eq "app.log blocks on member 1" "$(blocks_on "$MNT/app.log" 1)" 512
expect_eq "notes.txt (no rule) keeps the default" "$(layout "$MNT/notes.txt" | sed 's/ blocks=.*//')" default
head -c $((1 << 20)) /dev/urandom >>"$MNT/early.db"
check "sync" sync "$MNT/early.db"
expect_eq "early.db, made before the rule, takes it at its first open for writing" \
  "$(layout "$MNT/early.db" | sed 's/ blocks=.*//')" "mirrored devices=0"
expect_eq "early.db blocks on member 0" "$(blocks_on "$MNT/early.db" 0)" 256
expect_eq "user.tarn.layout is not listed" "$(getfattr --absolute-names -d "$MNT/app.db" 2>&1 | grep -c tarn)" 0

step "a file's own layout (setfattr user.tarn.layout)"
: >"$MNT/own.dat"
check "setfattr placement=append mirrored on an empty file" \
  setfattr -n user.tarn.layout -v "placement=append mirrored" "$MNT/own.dat"
head -c $((1 << 20)) /dev/urandom >>"$MNT/own.dat"
check "sync" sync "$MNT/own.dat"
expect_eq "own.dat layout" "$(layout "$MNT/own.dat" | sed 's/ blocks=.*//')" "placement=append mirrored devices=0"
expect_eq "own.dat blocks on member 0" "$(blocks_on "$MNT/own.dat" 0)" 256
cd "$MNT"
expect_eq "a bad value: EINVAL" "$(pyx "err(lambda: os.setxattr('own.dat', 'user.tarn.layout', b'placement=fast'))")" EINVAL
expect_eq "a stripe change after data: EINVAL" \
  "$(pyx "err(lambda: os.setxattr('own.dat', 'user.tarn.layout', b'stripe=2'))")" EINVAL
expect_eq "a directory has no layout: EINVAL" "$(pyx "err(lambda: os.setxattr('.', 'user.tarn.layout', b'mirrored'))")" EINVAL
: >new.dat
expect_eq "a stripe before data" "$(pyx "err(lambda: os.setxattr('new.dat', 'user.tarn.layout', b'stripe=2:4K'))")" ok
cd /
grep -q "stripe of a file is set before it has data" "$T/mount.log" &&
  ok "the mount log says why the stripe change was refused" || bad "no reason for the stripe refusal in mount.log"
fs_umount
fs_clean "after writing"

step "leg B gone: the mirrored file still reads back byte-identical"
truncate -s 0 "$T/B.img"
expect_eq "pool state" "$(tarn pool status -p "$POOL" --json 2>/dev/null | jq -r .state)" DEGRADED
fs_mount home
expect_eq "app.db sha256 with one leg" "$(sha256sum <"$MNT/app.db" | cut -d' ' -f1)" "$(sha256sum <"$T/db.ref" | cut -d' ' -f1)"
fs_umount

step "--mirrored on a pool with no mirrored member"
P2=$T/plain.img
make_pool "$P2" 256M
check "tarn fs create other" tarn fs create other -p "$P2"
check_fails "rule --mirrored refused" tarn fs layout-policy other add '*.db' --mirrored -p "$P2"
printf '%s' "$LAST_OUT" | grep -q "no mirrored member" && ok "the error says the pool has no mirrored member" ||
  bad "error: $LAST_OUT"
expect_eq "nothing written" "$(tarn fs layout-policy other list --json -p "$P2" | jq '.rules | length')" 0
e2e_finish

#!/usr/bin/env bash
# User extended attributes on a tarn file volume (issue 15), on a real
# FUSE mount: setfattr/getfattr -d on files and directories; XATTR_CREATE
# and XATTR_REPLACE (EEXIST, ENODATA); the limits (value 64 KiB, E2BIG
# past it; name 255 bytes, ERANGE past it; 256 KiB per inode, ENOSPC
# past it, nothing changed); other namespaces ENOTSUP (POSIX ACLs:
# fs_acls.sh); a symlink EPERM;
# tarn's own user.tarn.* names never listed; `cp -a --preserve=all`
# round trip; values kept across a remount, a kill -9 after `sync
# MOUNT`, and in a volume snapshot (`foo@N`, `dir@N/foo`) and a file
# version; EROFS in a version; pool and fs checks clean.
. "$(dirname "$0")/lib.sh"
need fusermount3 mountpoint setfattr getfattr cp
need_root "mounts a FUSE file system"
need_fuse
e2e_init fs_xattrs

POOL=$T/pool.img
MNT=$T/mnt
mkdir -p "$MNT"
MOUNT_PID=
# get NAME FILE: the value, or the error text
get() { getfattr --absolute-names --only-values -n "$1" "$2" 2>&1; }
# hex NAME FILE: the value as getfattr -e hex prints it
hex() { getfattr --absolute-names -e hex -n "$1" "$2" 2>&1 | sed -n "s/^$1=//p"; }
# attrs FILE: every user.* name=value, one line
attrs() { getfattr --absolute-names -d -e hex "$1" 2>&1 | grep '^user' | tr '\n' ' '; }

step "set, get, list on a file and a directory"
make_pool "$POOL" 1G
check "tarn fs create home" tarn fs create home -p "$POOL"
fs_mount home
echo data >"$MNT/f"
mkdir "$MNT/d"
echo inner >"$MNT/d/g"
check "setfattr user.color on a file" setfattr -n user.color -v blue "$MNT/f"
check "setfattr user.empty (empty value)" setfattr -n user.empty "$MNT/f"
check "setfattr user.tag on a directory" setfattr -n user.tag -v dir1 "$MNT/d"
check "setfattr user.bin (binary, 0x-encoded)" setfattr -n user.bin -v 0x00ff10 "$MNT/d/g"
expect_eq "getfattr -d of the file" "$(getfattr --absolute-names -d "$MNT/f" | grep '^user' | tr '\n' ' ')" 'user.color="blue" user.empty="" ' 
expect_eq "getfattr of the directory" "$(get user.tag "$MNT/d")" dir1
expect_eq "binary value" "$(hex user.bin "$MNT/d/g")" "0x00ff10"
check "replace a value" setfattr -n user.color -v red "$MNT/f"
expect_eq "replaced" "$(get user.color "$MNT/f")" red
check "remove user.empty" setfattr -x user.empty "$MNT/f"
check_fails "remove it again (ENODATA)" setfattr -x user.empty "$MNT/f"
expect_eq "the error is 'No such attribute'" "$(printf '%s' "$LAST_OUT" | grep -c 'No such attribute')" 1
check_fails "get a missing name" getfattr -n user.none "$MNT/f"

step "flags, limits, other namespaces"
cd "$MNT"
expect_eq "XATTR_CREATE of an existing name: EEXIST" "$(pyx "err(lambda: os.setxattr('f', 'user.color', b'x', os.XATTR_CREATE))")" EEXIST
expect_eq "XATTR_REPLACE of a missing name: ENODATA" "$(pyx "err(lambda: os.setxattr('f', 'user.new', b'x', os.XATTR_REPLACE))")" ENODATA
expect_eq "XATTR_CREATE of a new name" "$(pyx "err(lambda: os.setxattr('f', 'user.new', b'x', os.XATTR_CREATE))")" ok
expect_eq "XATTR_REPLACE of it" "$(pyx "err(lambda: os.setxattr('f', 'user.new', b'y', os.XATTR_REPLACE))")" ok
expect_eq "a value of 64 KiB" "$(pyx "err(lambda: os.setxattr('f', 'user.v1', b'a' * 65536))")" ok
expect_eq "a value of 64 KiB + 1: E2BIG" "$(pyx "err(lambda: os.setxattr('f', 'user.v2', b'a' * 65537))")" E2BIG
expect_eq "a name of 255 bytes" "$(pyx "err(lambda: os.setxattr('f', 'user.' + 'n' * 250, b'1'))")" ok
expect_eq "a name of 256 bytes: ERANGE" "$(pyx "err(lambda: os.setxattr('f', 'user.' + 'n' * 251, b'1'))")" ERANGE
expect_eq "two more 64 KiB values" "$(pyx "err(lambda: [os.setxattr('f', 'user.v' + str(k), b'b' * 65536) for k in (3, 4)])")" ok
expect_eq "a fourth past 256 KiB per inode: ENOSPC" "$(pyx "err(lambda: os.setxattr('f', 'user.v5', b'c' * 65536))")" ENOSPC
expect_eq "nothing changed by it" "$(pyx "print(len(os.getxattr('f', 'user.v4')), 'user.v5' in os.listxattr('f'))")" "65536 False"
expect_eq "getxattr with a small buffer: ERANGE (through listxattr's size too)" "$(pyx "import ctypes
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(2)
r = libc.getxattr(b'f', b'user.color', buf, 2)
print(errno.errorcode[ctypes.get_errno()] if r < 0 else r)")" ERANGE
expect_eq "trusted.*: ENOTSUP" "$(pyx "err(lambda: os.setxattr('f', 'trusted.x', b'1'))")" ENOTSUP
expect_eq "system.* other than the access control lists (fs_acls.sh): ENOTSUP" "$(pyx "err(lambda: os.setxattr('f', 'system.other', b'1'))")" ENOTSUP
ln -s f lnk
expect_eq "user.* on a symlink: EPERM" "$(pyx "err(lambda: os.setxattr('lnk', 'user.x', b'1', follow_symlinks=False))")" EPERM
cd - >/dev/null
check "a snapshot by user.tarn.snapshot" setfattr -n user.tarn.snapshot -v s1 "$MNT"
expect_eq "user.tarn.* never listed" "$(getfattr --absolute-names -d -m - "$MNT" "$MNT/f" | grep -c '^user.tarn')" 0

step "cp -a --preserve=all round trip"
check "cp -a --preserve=all d d2" cp -a --preserve=all "$MNT/d" "$MNT/d2"
expect_eq "the copied directory's attribute" "$(get user.tag "$MNT/d2")" dir1
# Out through ext4 (/var/tmp) and back: ext4 keeps one 4 KiB block of
# attributes per inode, so small ones.
echo small >"$MNT/s"
check "three small attributes" bash -c "setfattr -n user.a -v 1 '$MNT/s' && setfattr -n user.b -v 0x0001fe '$MNT/s' && setfattr -n user.c '$MNT/s'"
check "cp -a --preserve=all to ext4 and back" bash -c "cp -a --preserve=all '$MNT/s' '$T/s.out' && cp -a --preserve=all '$T/s.out' '$MNT/s2'"
expect_eq "the copied file's attributes" "$(attrs "$MNT/s2")" "$(attrs "$MNT/s")"
expect_eq "as many names" "$(attrs "$MNT/s2" | wc -w)" 3
expect_eq "binary value copied" "$(hex user.bin "$MNT/d2/g")" "0x00ff10"

step "snapshots and versions keep the set of their time"
check "change the file's color after s1" setfattr -n user.color -v green "$MNT/f"
check "remove the directory's tag after s1" setfattr -x user.tag "$MNT/d"
expect_eq "f@1 keeps red" "$(get user.color "$MNT/f@1")" red
expect_eq "d@1 keeps its tag" "$(get user.tag "$MNT/d@1")" dir1
expect_eq "d@1/g keeps its binary value" "$(hex user.bin "$MNT/d@1/g")" "0x00ff10"
expect_eq "the head has green" "$(get user.color "$MNT/f")" green
check_fails "setfattr in a version: EROFS" setfattr -n user.color -v x "$MNT/f@1"
expect_eq "the error is EROFS" "$(printf '%s' "$LAST_OUT" | grep -c 'Read-only file system')" 1
check "a per-file snapshot" setfattr -n user.tarn.snapshot -v one "$MNT/f"
check "change after it" setfattr -n user.color -v black "$MNT/f"
expect_eq "the file version keeps green" "$(get user.color "$MNT/f@2")" green

step "kept across remount and kill -9 after sync MOUNT"
fs_umount
fs_mount home
expect_eq "after remount: head" "$(get user.color "$MNT/f")" black
expect_eq "after remount: f@1" "$(get user.color "$MNT/f@1")" red
expect_eq "after remount: a 64 KiB value" "$(pyx "print(os.getxattr('$MNT/f', 'user.v4') == b'b' * 65536)")" True
check "setfattr then sync MOUNT" bash -c "setfattr -n user.last -v durable '$MNT/d' && sync '$MNT'"
kill9_mount
fs_clean "after kill -9"
fs_mount home
expect_eq "after kill -9: the synced attribute" "$(get user.last "$MNT/d")" durable
fs_umount
fs_clean "at the end"
e2e_finish

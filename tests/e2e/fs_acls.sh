#!/usr/bin/env bash
# POSIX access control lists on a tarn file volume (issue 15), on a real
# FUSE mount shared with other users (`tarn mount --allow-other`), with
# the acl tools: setfacl/getfacl on files and directories; the kernel
# enforcing a named user's entry and the mask for another user (nobody,
# through setpriv); chmod moving the mask; an access list the mode says
# all of is not kept; default lists inherited by new files (narrowed by
# the create mode, no umask) and directories (which inherit the default
# too); the umask applied where there is no default list; setfacl -b;
# set-group-ID cleared when a caller outside the group sets a list;
# lists on a fifo (enforced: nobody's open passes the permission check
# only through its entry) and a device node, inherited by a fifo;
# invalid lists refused (EINVAL) with the mode unchanged; `cp -a` to
# ext4 and back keeping the lists; a volume snapshot keeping the lists
# of its time (f@1); everything kept across a remount and a kill -9
# after `sync MOUNT`; fs and pool checks clean.
. "$(dirname "$0")/lib.sh"
need fusermount3 mountpoint setfacl getfacl setfattr setpriv cp stat mknod
need_root "mounts a FUSE file system other users reach"
need_fuse
e2e_init fs_acls

POOL=$T/pool.img
MNT=$T/mnt
mkdir -p "$MNT"
# nobody must reach the mount point through $T (mktemp made it 0700).
chmod 755 "$T"
MOUNT_PID=
NOBODY=$(id -u nobody)
# acl FILE: the list as `getfacl -c` prints it, on one line
acl() { getfacl -cp "$1" 2>&1 | grep . | tr '\t\n' '  '; }
# as_nobody CMD...: run as nobody (no capabilities)
as_nobody() { setpriv --reuid="$NOBODY" --regid="$(id -g nobody)" --clear-groups -- "$@"; }

step "access lists: getfacl, enforcement for another user, chmod and the mask"
make_pool "$POOL" 1G
check "tarn fs create home" tarn fs create home -p "$POOL"
fs_mount home --allow-other
umask 022
echo secret >"$MNT/f"
chmod 640 "$MNT/f"
check_fails "nobody cannot read a 0640 file" as_nobody cat "$MNT/f"
check "setfacl -m u:nobody:rw" setfacl -m u:nobody:rw "$MNT/f"
expect_eq "getfacl" "$(acl "$MNT/f")" "user::rw- user:nobody:rw- group::r-- mask::rw- other::--- "
expect_eq "the mode's group bits are the mask" "$(stat -c %A "$MNT/f")" "-rw-rw----"
expect_eq "nobody reads through its entry" "$(as_nobody cat "$MNT/f" 2>&1)" secret
check "nobody writes through its entry" as_nobody sh -c "echo by-nobody >>'$MNT/f'"
check "chmod 600 (the mask goes to ---)" chmod 600 "$MNT/f"
expect_eq "getfacl after chmod" "$(acl "$MNT/f")" "user::rw- user:nobody:rw- #effective:--- group::r-- #effective:--- mask::--- other::--- "
check_fails "nobody cannot read with the mask ---" as_nobody cat "$MNT/f"
check "chmod 660" chmod 660 "$MNT/f"
expect_eq "nobody reads again" "$(as_nobody cat "$MNT/f" 2>&1 | tr '\n' ' ')" "secret by-nobody "
check "setfacl -m u:nobody:- (no access)" setfacl -m u:nobody:- "$MNT/f"
check_fails "nobody refused by its own entry, though other is r--" bash -c "chmod o+r '$MNT/f' && setpriv --reuid=$NOBODY --regid=$(id -g nobody) --clear-groups -- cat '$MNT/f'"
check "setfacl -b (back to the mode)" setfacl -b "$MNT/f"
expect_eq "getfacl after -b: owner, group, other only" "$(acl "$MNT/f" | wc -w)" 3
expect_eq "no list is kept: ls shows no +" "$(ls -l "$MNT/f" | cut -c11)" " "
expect_eq "nobody reads through other" "$(as_nobody head -n1 "$MNT/f" 2>&1)" secret
check "a list the mode says all of (setfacl -m u::rwx)" setfacl -m u::rwx "$MNT/f"
expect_eq "only the mode changed" "$(stat -c %a "$MNT/f" | cut -c1) $(getfattr --absolute-names -m - -d "$MNT/f" 2>/dev/null | grep -c posix_acl)" "7 0"

step "default lists: inheritance, the create mode, no umask"
mkdir "$MNT/shared"
check "setfacl -d -m u:nobody:rwx on a directory" setfacl -d -m u:nobody:rwx "$MNT/shared"
check "and an access entry for nobody" setfacl -m u:nobody:rwx "$MNT/shared"
check "a file made by nobody (umask 077)" as_nobody sh -c "umask 077; echo mine >'$MNT/shared/n'"
expect_eq "its list: the default narrowed by the create mode 0666" "$(acl "$MNT/shared/n")" "user::rw- user:nobody:rwx #effective:rw- group::r-x #effective:r-- mask::rw- other::r-- "
expect_eq "its mode (the umask does not apply)" "$(stat -c %a "$MNT/shared/n")" 664
check "a directory made by root (umask 077)" bash -c "umask 077; mkdir '$MNT/shared/sub'"
expect_eq "it inherits the default list and an access list" "$(acl "$MNT/shared/sub")" "user::rwx user:nobody:rwx group::r-x mask::rwx other::r-x default:user::rwx default:user:nobody:rwx default:group::r-x default:mask::rwx default:other::r-x "
check "two levels down" bash -c "touch '$MNT/shared/sub/deep'"
expect_eq "the grandchild inherits" "$(getfacl -cp "$MNT/shared/sub/deep" | grep -c '^user:nobody:rwx')" 1
check "nobody writes into the subdirectory" as_nobody sh -c "echo x >'$MNT/shared/sub/by-nobody'"
check "a fifo in it (umask 0)" "$SYSPY" -c "import os; os.umask(0); os.mkfifo('$MNT/shared/fifo', 0o666)"
expect_eq "the fifo inherits as a file does: its list" "$(acl "$MNT/shared/fifo")" "user::rw- user:nobody:rwx #effective:rw- group::r-x #effective:r-- mask::rw- other::r-- "
expect_eq "and its mode" "$(stat -c %a "$MNT/shared/fifo")" 664
rm "$MNT/shared/fifo"
check "setfacl -k drops the default list" setfacl -k "$MNT/shared"
check "a file made after it (umask 027)" bash -c "umask 027; touch '$MNT/shared/after'"
expect_eq "the umask applies again, no list" "$(stat -c %a "$MNT/shared/after") $(acl "$MNT/shared/after")" "640 user::rw- group::r-- other::--- "
check "umask 027 outside: mkdir" bash -c "umask 027; mkdir '$MNT/plain'"
expect_eq "its mode" "$(stat -c %a "$MNT/plain")" 750

step "lists on a fifo and a device node"
"$SYSPY" -c "import os; os.umask(0); os.mkfifo('$MNT/p', 0o600)"
# fifo_open: how nobody's open for writing ends (no reader: ENXIO once
# the permission check passed).
fifo_open() { as_nobody "$SYSPY" -c "import os, errno
try:
    os.open('$MNT/p', os.O_WRONLY | os.O_NONBLOCK)
    print('opened')
except OSError as e:
    print(errno.errorcode[e.errno])"; }
expect_eq "nobody may not open a 0600 fifo" "$(fifo_open)" EACCES
check "setfacl -m u:nobody:w on the fifo" setfacl -m u:nobody:w "$MNT/p"
expect_eq "its list" "$(acl "$MNT/p")" "user::rw- user:nobody:-w- group::--- mask::-w- other::--- "
expect_eq "nobody passes the permission check now" "$(fifo_open)" ENXIO
check_fails "user.* on a fifo: refused (EPERM, as Linux)" setfattr -n user.x -v 1 "$MNT/p"
check "mknod a character device (1:3)" mknod -m 644 "$MNT/dev" c 1 3
check "setfacl on the device node" setfacl -m u:nobody:r "$MNT/dev"
expect_eq "its list" "$(acl "$MNT/dev")" "user::rw- user:nobody:r-- group::r-- mask::r-- other::r-- "
check "chmod 600 the device node" chmod 600 "$MNT/dev"
expect_eq "the mask follows" "$(acl "$MNT/dev")" "user::rw- user:nobody:r-- #effective:--- group::r-- #effective:--- mask::--- other::--- "

step "bad lists, set-group-ID, where lists go"
cd "$MNT"
MODE0=$(stat -c %a shared/n)
# A named user without a mask, then entries out of order: the kernel or
# tarn refuses each (EINVAL), nothing changes.
expect_eq "a named user without a mask: EINVAL" "$(pyx "import struct
e = lambda *t: b''.join(struct.pack('<HHI', *x) for x in t)
err(lambda: os.setxattr('shared/n', 'system.posix_acl_access', b'\\x02\\0\\0\\0' + e((1, 6, 0xffffffff), (2, 4, 1234), (4, 4, 0xffffffff), (0x20, 4, 0xffffffff))))")" EINVAL
expect_eq "entries out of order: EINVAL" "$(pyx "import struct
e = lambda *t: b''.join(struct.pack('<HHI', *x) for x in t)
err(lambda: os.setxattr('shared/n', 'system.posix_acl_access', b'\\x02\\0\\0\\0' + e((4, 4, 0xffffffff), (1, 6, 0xffffffff), (0x20, 4, 0xffffffff))))")" EINVAL
expect_eq "mode and list unchanged" "$(stat -c %a shared/n) $(getfacl -c shared/n | grep -c nobody)" "$MODE0 1"
expect_eq "a default list on a file: refused" "$(pyx "err(lambda: os.setxattr('f', 'system.posix_acl_default', os.getxattr('plain/../shared/sub', 'system.posix_acl_default')))")" EACCES
cd - >/dev/null
mkdir "$MNT/g"
chmod 777 "$MNT/g"
check "a set-group-ID file of nobody, group root" bash -c "as_nobody() { setpriv --reuid=$NOBODY --regid=$(id -g nobody) --clear-groups -- \"\$@\"; }; as_nobody touch '$MNT/g/s' && chgrp root '$MNT/g/s' && chmod 2775 '$MNT/g/s'"
expect_eq "its mode" "$(stat -c %a "$MNT/g/s")" 2775
check "nobody (not in group root) sets a list on it" as_nobody setfacl -m u:nobody:rwx "$MNT/g/s"
expect_eq "set-group-ID cleared (FUSE_SETXATTR_ACL_KILL_SGID)" "$(stat -c %a "$MNT/g/s")" 775
check "root sets one on a set-group-ID file" bash -c "chmod 2775 '$MNT/g/s' && setfacl -m u:daemon:r '$MNT/g/s'"
expect_eq "set-group-ID kept for root" "$(stat -c %a "$MNT/g/s")" 2775
ln -s f "$MNT/lnk"
expect_eq "a list on a symlink itself: ENOTSUP" "$(pyx "err(lambda: os.setxattr('$MNT/lnk', 'system.posix_acl_access', os.getxattr('$MNT/shared/n', 'system.posix_acl_access'), follow_symlinks=False))")" ENOTSUP

step "cp -a to ext4 and back, a volume snapshot"
check "cp -a the tree out to ext4" cp -a "$MNT/shared" "$T/shared.out"
expect_eq "ext4 holds the lists" "$(acl "$T/shared.out/n")" "$(acl "$MNT/shared/n")"
check "cp -a back in" cp -a "$T/shared.out" "$MNT/shared.back"
for p in n sub sub/deep; do
  expect_eq "copied back: $p" "$(acl "$MNT/shared.back/$p")" "$(acl "$MNT/shared/$p")"
done
check "a volume snapshot" setfattr -n user.tarn.snapshot -v s1 "$MNT"
check "change the list after it" setfacl -x u:nobody "$MNT/shared/n"
expect_eq "the head lost nobody" "$(getfacl -cp "$MNT/shared/n" | grep -c nobody)" 0
expect_eq "shared@1/n keeps the list of its time" "$(acl "$MNT/shared@1/n")" "user::rw- user:nobody:rwx #effective:rw- group::r-x #effective:r-- mask::rw- other::r-- "
check_fails "setfacl in a version: EROFS" setfacl -m u:daemon:r "$MNT/shared@1/n"

step "kept across remount and kill -9 after sync MOUNT"
fs_umount
fs_mount home --allow-other
expect_eq "after remount: a default list" "$(acl "$MNT/shared/sub" | grep -c 'default:user:nobody:rwx')" 1
expect_eq "after remount: the fifo's list" "$(acl "$MNT/p")" "user::rw- user:nobody:-w- group::--- mask::-w- other::--- "
expect_eq "after remount: nobody still writes through its entry" "$(as_nobody sh -c "echo again >>'$MNT/shared/sub/by-nobody' && echo ok" 2>&1)" ok
check "setfacl then sync MOUNT" bash -c "setfacl -m u:daemon:rw '$MNT/f' && sync '$MNT'"
kill9_mount
fs_clean "after kill -9"
fs_mount home --allow-other
expect_eq "after kill -9: the synced list" "$(getfacl -cp "$MNT/f" | grep -c '^user:daemon:rw-')" 1
fs_umount
fs_clean "at the end"
e2e_finish
